package shop

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
)

// amountPattern is a non-negative decimal amount with at most two decimals.
var amountPattern = regexp.MustCompile(`^(\d{1,12})(?:\.(\d{1,2}))?$`)

// parseCents turns a JSON number such as 12, 12.5 or 12.50 into cents.
func parseCents(n json.Number) (int64, error) {
	m := amountPattern.FindStringSubmatch(string(n))
	if m == nil {
		return 0, fmt.Errorf("%q is not an amount with at most two decimals", string(n))
	}
	units, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", string(n), err)
	}
	frac := m[2]
	for len(frac) < 2 {
		frac += "0"
	}
	cents, _ := strconv.ParseInt(frac, 10, 64) // two digits, checked by the pattern
	return units*100 + cents, nil
}

// formatCents renders cents as a JSON number with two decimals ("12.50"),
// which the email templates print as written.
func formatCents(cents int64) json.Number {
	return json.Number(fmt.Sprintf("%d.%02d", cents/100, cents%100))
}
