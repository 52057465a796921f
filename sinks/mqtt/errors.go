package mqtt

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/eclipse/paho.golang/packets"

	"github.com/heraldhq/herald/sinks"
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
	return fmt.Sprintf("mqtt: %s reason code 0x%02X (%s)", e.Packet, e.Code, reasonText(e.Packet, e.Code))
}

// reasonText is the specification's name for a reason code: the text paho
// has for it, up to its explanation. The broker's own reason string is not
// used: a peer's text does not go into errors unchecked.
func reasonText(packet string, code byte) string {
	var text string
	switch packet {
	case "CONNACK":
		text = (&packets.Connack{ReasonCode: code}).Reason()
	case "DISCONNECT":
		text = (&packets.Disconnect{ReasonCode: code}).Reason()
	default:
		text = (&packets.Puback{ReasonCode: code}).Reason()
	}
	name, _, _ := strings.Cut(text, " - ")
	if name == "" {
		return "unknown"
	}
	return name
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
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var recordErr tls.RecordHeaderError
	return errors.As(err, &netErr) || errors.As(err, &certErr) || errors.As(err, &unknownAuth) ||
		errors.As(err, &hostErr) || errors.As(err, &recordErr)
}
