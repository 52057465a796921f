// Package routefilter compiles the `where:` expressions of routes: CEL
// (https://cel.dev) over an event's topic, key, headers and payload,
// type-checked when the configuration is loaded and evaluated by the relay
// for each event whose topic matches the route.
//
// The CEL specifics live here so that the engine sees a small API: Compile
// an expression into a Filter, then Match it against an Event.
package routefilter

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"
)

// MaxCost bounds the work one evaluation may do, in CEL's cost units (about
// one per operation, plus the size of strings and lists an operation walks).
// A filter that exceeds it on an event fails on that event (an evaluation
// error), so that a hostile payload cannot stall a claim loop. It allows a
// walk over about a thousand list elements; a typical filter costs under
// twenty. It is kept this low also because cel-go v0.31's cost tracker
// grows a stack during comprehensions and searches it linearly, so that
// tracking itself is quadratic in the elements walked: a limit of a million
// let one `exists` over 100,000 elements run for over a minute.
const MaxCost = 10_000

// maxExprBytes bounds the source of an expression: a filter is a line or
// two, and the parser's work grows with it.
const maxExprBytes = 4096

// Filter is a compiled `where:` expression. It is safe for concurrent use.
type Filter struct {
	src string
	prg cel.Program
}

// env declares the variables an expression sees. It is built once: a
// cel.Env is safe for concurrent use and costly to make.
var env = func() *cel.Env {
	e, err := cel.NewEnv(
		cel.Variable("topic", cel.StringType),
		cel.Variable("key", cel.StringType),
		cel.Variable("headers", cel.MapType(cel.StringType, cel.StringType)),
		cel.Variable("payload", cel.DynType),
		cel.ParserExpressionSizeLimit(maxExprBytes),
	)
	if err != nil {
		// The declarations above are constant: this cannot fail at run time
		// unless cel-go itself changed, which the package's tests catch.
		panic(fmt.Sprintf("routefilter: declaring the CEL environment: %v", err))
	}
	return e
}()

// Compile parses and type-checks expr. The error lists each problem with
// its position in expr ("line 1, column 9: undeclared reference to 'x'").
// The expression must be of type bool and use only topic (string), key
// (string), headers (map of string to string) and payload (the parsed JSON,
// of any type).
func Compile(expr string) (*Filter, error) {
	if strings.TrimSpace(expr) == "" {
		return nil, errors.New("empty expression")
	}
	if len(expr) > maxExprBytes {
		return nil, fmt.Errorf("expression is %d bytes, more than %d", len(expr), maxExprBytes)
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		msgs := make([]string, 0, len(iss.Errors()))
		for _, e := range iss.Errors() {
			msgs = append(msgs, fmt.Sprintf("line %d, column %d: %s", e.Location.Line(), e.Location.Column()+1, e.Message))
		}
		return nil, errors.New(strings.Join(msgs, "; "))
	}
	if t := ast.OutputType(); !t.IsExactType(cel.BoolType) {
		return nil, fmt.Errorf("line 1, column 1: the expression is of type %s, not bool (compare a payload field explicitly: payload.flag == true)", t)
	}
	prg, err := env.Program(ast, cel.CostLimit(MaxCost))
	if err != nil {
		return nil, fmt.Errorf("planning the expression: %w", err)
	}
	return &Filter{src: expr, prg: prg}, nil
}

// String returns the expression as written.
func (f *Filter) String() string { return f.src }

// Match evaluates the filter on ev. An error (a missing field, a type
// mismatch, the cost limit, a payload that is not valid JSON) means the
// filter could not decide; the caller chooses what that means.
func (f *Filter) Match(ev *Event) (bool, error) {
	out, _, err := f.prg.Eval(ev)
	if err != nil {
		return false, err
	}
	b, ok := out.Value().(bool)
	if !ok {
		// Compile checked the type; a dyn value may still end up non-bool.
		return false, fmt.Errorf("the expression gave %s, not a bool", out.Type())
	}
	return b, nil
}

// Event is what an expression sees of an event. Make one per event and
// hand it to every filter the event meets: the payload is parsed at most
// once, and only if an expression reads it. An Event is not safe for
// concurrent use.
type Event struct {
	Topic, Key string
	Headers    map[string]string
	// Payload is the event's body; it is parsed as JSON when JSON is set.
	Payload []byte
	// JSON says the payload is JSON text. Otherwise (a binary payload)
	// payload is an empty map: has(payload.x) is false and reading
	// payload.x is an evaluation error.
	JSON bool

	parsed    bool
	payload   ref.Val
	decodeErr error
}

var noHeaders = map[string]string{}

// emptyPayload is what payload is for a binary event.
var emptyPayload = types.NewRefValMap(types.DefaultTypeAdapter, map[ref.Val]ref.Val{})

// ResolveName implements interpreter.Activation.
func (ev *Event) ResolveName(name string) (any, bool) {
	switch name {
	case "topic":
		return ev.Topic, true
	case "key":
		return ev.Key, true
	case "headers":
		if ev.Headers == nil {
			return noHeaders, true
		}
		return ev.Headers, true
	case "payload":
		if !ev.parsed {
			ev.parsed = true
			ev.payload, ev.decodeErr = ev.decode()
		}
		if ev.decodeErr != nil {
			// An error value makes the evaluation fail with it, where
			// the expression reads the payload.
			return types.WrapErr(ev.decodeErr), true
		}
		return ev.payload, true
	}
	return nil, false
}

// Parent implements interpreter.Activation.
func (ev *Event) Parent() interpreter.Activation { return nil }

func (ev *Event) decode() (ref.Val, error) {
	if !ev.JSON {
		return emptyPayload, nil
	}
	var v any
	if err := json.Unmarshal(ev.Payload, &v); err != nil {
		return nil, fmt.Errorf("payload is not valid JSON: %w", err)
	}
	return celValue(v), nil
}

// celValue converts decoded JSON into CEL values once. Handing CEL the Go
// maps and slices instead makes it adapt them by reflection on every
// access, which turns a walk over a large list quadratic.
func celValue(v any) ref.Val {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[ref.Val]ref.Val, len(v))
		for k, e := range v {
			m[types.String(k)] = celValue(e)
		}
		return types.NewRefValMap(types.DefaultTypeAdapter, m)
	case []any:
		l := make([]ref.Val, len(v))
		for i, e := range v {
			l[i] = celValue(e)
		}
		return types.NewRefValList(types.DefaultTypeAdapter, l)
	case string:
		return types.String(v)
	case float64:
		return types.Double(v)
	case bool:
		return types.Bool(v)
	default: // nil: JSON null
		return types.NullValue
	}
}
