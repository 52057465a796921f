// Package sinkconfig holds what Herald's sinks share besides the sink
// contract (package sinks): the values of their configuration that need
// care (Secret, which never prints; TLSConfig, one TLS block for every
// sink), RedactURL, which shows a configured URL without its credentials,
// and CheckJSON, which tells why a JSON payload cannot be encoded. A sink
// written outside Herald may use them too.
package sinkconfig
