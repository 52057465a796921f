// Package sinkconfig holds what Herald's sinks share besides the sink
// contract (package sinks): the values of their configuration that need
// care (Secret, which never prints; TLSConfig, one TLS block for every
// sink), RedactURL, which shows a configured URL without its credentials,
// CheckJSON, which tells why a JSON payload cannot be encoded, Prepare,
// which validates a configuration and fills its defaults, and NotNegative,
// the check of a count, size or duration setting. A sink written outside
// Herald may use them too.
package sinkconfig
