package mqtt

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// ErrClosed is reported (as Unavailable) by Publish after Close.
var ErrClosed = errors.New("mqtt: sink closed")

// ErrConnectionLost is reported (as Unavailable) for a message sent on a
// connection that dropped before its PUBACK arrived: the broker may or may
// not have it.
var ErrConnectionLost = errors.New("mqtt: connection lost before the PUBACK")

// ReasonError is a reason code of 0x80 or more that the broker answered a
// CONNECT or a PUBLISH with.
type ReasonError struct {
	// Packet is the packet that carried the code: "CONNACK", "PUBACK" or
	// "DISCONNECT".
	Packet string
	// Code is the MQTT 5 reason code.
	Code byte
}

func (e *ReasonError) Error() string {
	return fmt.Sprintf("mqtt: %s reason code 0x%02X (%s)", e.Packet, e.Code, reasonText(e.Code))
}

// reasonNames are the names MQTT 5 gives the failure reason codes (section
// 2.4), the same in CONNACK, PUBACK and DISCONNECT.
var reasonNames = map[byte]string{
	0x80: "Unspecified error", 0x81: "Malformed Packet", 0x82: "Protocol Error",
	0x83: "Implementation specific error", 0x84: "Unsupported Protocol Version",
	0x85: "Client Identifier not valid", 0x86: "Bad User Name or Password", 0x87: "Not authorized",
	0x88: "Server unavailable", 0x89: "Server busy", 0x8A: "Banned", 0x8B: "Server shutting down",
	0x8C: "Bad authentication method", 0x8D: "Keep Alive timeout", 0x8E: "Session taken over",
	0x90: "Topic Name invalid", 0x93: "Receive Maximum exceeded", 0x94: "Topic Alias invalid",
	0x95: "Packet too large", 0x96: "Message rate too high", 0x97: "Quota exceeded",
	0x98: "Administrative action", 0x99: "Payload format invalid", 0x9A: "Retain not supported",
	0x9B: "QoS not supported", 0x9C: "Use another server", 0x9D: "Server moved",
	0x9F: "Connection rate exceeded",
}

// reasonText is the specification's name for a reason code. The broker's
// own reason string is not used: a peer's text does not go into errors and
// logs unchecked.
func reasonText(code byte) string {
	if name, ok := reasonNames[code]; ok {
		return name
	}
	if code < 0x80 {
		return "not a failure"
	}
	return "unknown"
}

// Reason codes the sink treats apart (MQTT 5, section 2.4).
const (
	codeNotAuthorized        byte = 0x87
	codeTopicNameInvalid     byte = 0x90
	codePacketTooLarge       byte = 0x95
	codeQuotaExceeded        byte = 0x97
	codePayloadFormatInvalid byte = 0x99
)

// classifyReason marks a failed PUBACK's code: refusals of the message
// itself are permanent, a refusal of the client (not authorized: a setup
// error that affects every event) pauses the sink, and the rest (quota
// exceeded, unspecified and implementation-specific errors) are retried.
func classifyReason(code byte) error {
	err := &ReasonError{Packet: "PUBACK", Code: code}
	switch code {
	case codeTopicNameInvalid, codePacketTooLarge, codePayloadFormatInvalid:
		return sinks.Permanent(err)
	case codeNotAuthorized:
		return sinks.Unavailable(fmt.Errorf("%w: the broker's ACL refuses this client the topic", err))
	case codeQuotaExceeded:
		return fmt.Errorf("%w: the broker is over a quota; retried", err)
	}
	return err
}

// classifyConnect marks an error connecting: every one is Unavailable
// (refused, unreachable, TLS, authentication, a CONNACK refusal), except a
// cancelled or expired context, which is the caller's.
func classifyConnect(err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return sinks.Unavailable(err)
}

// isNetwork reports whether err is a network or TLS failure.
func isNetwork(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || sinkconfig.IsTLSError(err)
}
