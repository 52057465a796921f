package email_test

import (
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/heraldhq/herald/sinks/email"
)

// The sink's entry in the relay's YAML configuration, minus name and type.
func ExampleConfig() {
	const entry = `
smtp: {host: localhost, port: 1025}
from: Shop <shop@example.com>
templates_dir: testdata/templates
template: order_paid
subject: Your order is paid
to_field: customer.email
timeout: 10s
`
	var cfg email.Config
	if err := yaml.Unmarshal([]byte(entry), &cfg); err != nil {
		fmt.Println(err)
		return
	}
	s, err := email.New("receipts", cfg, nil) // parses the templates; connects on first Publish
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(s.Name(), cfg.SMTP.Host, cfg.SMTP.Port, cfg.Timeout, cfg.ToField)
	// Output: receipts localhost 1025 10s customer.email
}
