package mqtt

import (
	"errors"
	"strings"
	"testing"

	"github.com/heraldhq/herald/sinks"
)

// TestClassifyReason covers the PUBACK codes the machine's Mosquitto never
// sends (it does not check the payload format indicator, and has no
// quotas); 0x87 is also checked against a real broker in
// TestPrivateBrokerSetupErrors.
func TestClassifyReason(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code                   byte
		permanent, unavailable bool
		text                   string
	}{
		{0x80, false, false, "Unspecified error"},
		{0x83, false, false, "Implementation specific error"},
		{0x87, false, true, "Not authorized"},
		{0x90, true, false, "Topic Name invalid"},
		{0x95, true, false, "Packet too large"},
		{0x97, false, false, "Quota exceeded"},
		{0x99, true, false, "Payload format invalid"},
	} {
		err := classifyReason(tc.code)
		var reason *ReasonError
		if sinks.IsPermanent(err) != tc.permanent || sinks.IsUnavailable(err) != tc.unavailable ||
			!errors.As(err, &reason) || reason.Code != tc.code {
			t.Errorf("0x%02X: %v (permanent %v, unavailable %v), want permanent %v, unavailable %v",
				tc.code, err, sinks.IsPermanent(err), sinks.IsUnavailable(err), tc.permanent, tc.unavailable)
		}
		if want := "(" + tc.text; !strings.Contains(err.Error(), want) {
			t.Errorf("0x%02X: %q does not name the code %q", tc.code, err, tc.text)
		}
	}
}
