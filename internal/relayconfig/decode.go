package relayconfig

import (
	"encoding"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/docker/go-units"
	"go.yaml.in/yaml/v3"

	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// fieldError is a configuration error at a key path ("relay.lease"), with
// the line it was found on when known.
type fieldError struct {
	path string
	line int
	msg  string
}

func (e *fieldError) Error() string {
	if e.line > 0 {
		return fmt.Sprintf("%s: %s (line %d)", e.path, e.msg, e.line)
	}
	return fmt.Sprintf("%s: %s", e.path, e.msg)
}

func fieldErr(n *yaml.Node, path, msg string) error {
	if path == "" {
		path = "(top level)"
	}
	e := &fieldError{path: path, msg: msg}
	if n != nil {
		e.line = n.Line
	}
	return e
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var (
	durationType    = reflect.TypeFor[time.Duration]()
	byteSizeType    = reflect.TypeFor[ByteSize]()
	nodeType        = reflect.TypeFor[yaml.Node]()
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	textType        = reflect.TypeFor[encoding.TextUnmarshaler]()
	secretType      = reflect.TypeFor[sinkconfig.Secret]()
)

// decoder decodes YAML nodes strictly into Go values.
type decoder struct {
	// expanded holds the text, before expansion, of values that took text
	// from the environment: errors quote it instead of the value, which may
	// be a secret.
	expanded map[*yaml.Node]string
	// fromEnv marks the values that took their text from the environment
	// and none from a default written in the file.
	fromEnv map[*yaml.Node]bool
	// inlineSecrets are the key paths of the non-empty secrets (sinkconfig.Secret
	// fields) written in the file itself, in file order.
	inlineSecrets []string
	// readOnly skips the sinks' settings (LoadReadOnly).
	readOnly bool
	// sinkTypes are the Loader's sink types, beside the built-in ones.
	sinkTypes map[string]SinkType
}

// decode decodes n into out (settable), strictly: an unknown or repeated key,
// an alias or a value of the wrong shape is an error naming the key path.
// Absent and null values leave out unchanged.
func (d *decoder) decode(n *yaml.Node, out reflect.Value, path string) error {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		n = n.Content[0]
	}
	if n.Kind == yaml.AliasNode {
		return fieldErr(n, path, "YAML aliases (*name) are not supported")
	}
	t := out.Type()
	switch {
	case t == nodeType:
		out.Set(reflect.ValueOf(*n))
		return nil
	case t == durationType:
		return d.decodeDuration(n, out, path)
	case t == byteSizeType:
		return d.decodeByteSize(n, out, path)
	case out.CanAddr() && t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(unmarshalerType):
		if err := n.Decode(out.Addr().Interface()); err != nil {
			return fieldErr(n, path, cleanYAMLError(err))
		}
		return nil
	}
	if isNull(n) {
		return nil
	}
	if t == secretType && n.Kind == yaml.ScalarNode && n.Value != "" && !d.fromEnv[n] {
		d.inlineSecrets = append(d.inlineSecrets, path)
	}
	switch t.Kind() {
	case reflect.Pointer:
		v := reflect.New(t.Elem())
		if err := d.decode(n, v.Elem(), path); err != nil {
			return err
		}
		out.Set(v)
		return nil
	case reflect.Struct:
		return d.decodeStruct(n, out, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return fieldErr(n, path, "expected a list, got "+d.describe(n))
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, c := range n.Content {
			if err := d.decode(c, s.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		out.Set(s)
		return nil
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return fieldErr(n, path, "expected a mapping, got "+d.describe(n))
		}
		m := reflect.MakeMapWithSize(t, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return fieldErr(k, path, "keys must be scalars")
			}
			kv := reflect.New(t.Key()).Elem()
			if err := d.decodeScalar(k, kv, joinKey(path, k.Value)); err != nil {
				return err
			}
			if m.MapIndex(kv).IsValid() {
				return fieldErr(k, joinKey(path, k.Value), "duplicate key")
			}
			vv := reflect.New(t.Elem()).Elem()
			if err := d.decode(v, vv, joinKey(path, k.Value)); err != nil {
				return err
			}
			m.SetMapIndex(kv, vv)
		}
		out.Set(m)
		return nil
	case reflect.Interface:
		if err := n.Decode(out.Addr().Interface()); err != nil {
			return fieldErr(n, path, cleanYAMLError(err))
		}
		return nil
	}
	return d.decodeScalar(n, out, path)
}

// structFields maps yaml keys to field index paths, following inline fields.
func structFields(t reflect.Type) map[string][]int {
	fields := map[string][]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(","+opts+",", ",inline,") && f.Type.Kind() == reflect.Struct {
			for k, idx := range structFields(f.Type) {
				fields[k] = append([]int{i}, idx...)
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = []int{i}
	}
	return fields
}

func (d *decoder) decodeStruct(n *yaml.Node, out reflect.Value, path string) error {
	if n.Kind != yaml.MappingNode {
		return fieldErr(n, path, "expected a mapping, got "+d.describe(n))
	}
	fields := structFields(out.Type())
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return fieldErr(k, path, "keys must be scalars")
		}
		if k.Value == "<<" {
			return fieldErr(k, joinKey(path, k.Value), "YAML merge keys are not supported")
		}
		p := joinKey(path, k.Value)
		if line, dup := seen[k.Value]; dup {
			return fieldErr(k, p, fmt.Sprintf("duplicate key (first set on line %d)", line))
		}
		seen[k.Value] = k.Line
		idx, ok := fields[k.Value]
		if !ok {
			msg := "unknown key"
			if near := nearestKey(k.Value, slices.Collect(maps.Keys(fields))); near != "" {
				msg += "; did you mean " + joinKey(path, near) + "?"
			}
			return fieldErr(k, p, msg)
		}
		if err := d.decode(v, out.FieldByIndex(idx), p); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) decodeDuration(n *yaml.Node, out reflect.Value, path string) error {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.ScalarNode {
		return fieldErr(n, path, "expected a duration such as 30s, got "+d.describe(n))
	}
	if n.Value == "0" {
		out.SetInt(0)
		return nil
	}
	dur, err := time.ParseDuration(n.Value)
	if err != nil {
		return fieldErr(n, path, fmt.Sprintf("invalid duration %s (use a number with a unit: 500ms, 30s, 5m, 1h)", d.quote(n)))
	}
	out.SetInt(int64(dur))
	return nil
}

func (d *decoder) decodeByteSize(n *yaml.Node, out reflect.Value, path string) error {
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.ScalarNode {
		return fieldErr(n, path, "expected a size such as 64MiB, got "+d.describe(n))
	}
	size, err := units.RAMInBytes(n.Value)
	if err != nil || size < 0 {
		return fieldErr(n, path, fmt.Sprintf("invalid size %s (use bytes, or a number with a unit: 512KiB, 64MiB, 1GiB)", d.quote(n)))
	}
	out.SetInt(size)
	return nil
}

func (d *decoder) decodeScalar(n *yaml.Node, out reflect.Value, path string) error {
	if n.Kind != yaml.ScalarNode {
		return fieldErr(n, path, "expected "+kindName(out.Type())+", got "+d.describe(n))
	}
	if out.CanAddr() && reflect.PointerTo(out.Type()).Implements(textType) {
		if err := out.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(n.Value)); err != nil {
			return fieldErr(n, path, err.Error())
		}
		return nil
	}
	tag := n.ShortTag()
	bad := func() error {
		return fieldErr(n, path, fmt.Sprintf("expected %s, got %s", kindName(out.Type()), d.quote(n)))
	}
	switch out.Kind() {
	case reflect.String:
		out.SetString(n.Value)
	case reflect.Bool:
		if tag != "!!bool" {
			return bad()
		}
		b, err := strconv.ParseBool(n.Value)
		if err != nil {
			return bad()
		}
		out.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if tag != "!!int" {
			return bad()
		}
		i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 0, out.Type().Bits())
		if err != nil {
			return bad()
		}
		out.SetInt(i)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if tag != "!!int" {
			return bad()
		}
		u, err := strconv.ParseUint(strings.ReplaceAll(n.Value, "_", ""), 0, out.Type().Bits())
		if err != nil {
			return bad()
		}
		out.SetUint(u)
	case reflect.Float32, reflect.Float64:
		if tag != "!!int" && tag != "!!float" {
			return bad()
		}
		f, err := strconv.ParseFloat(n.Value, out.Type().Bits())
		if err != nil {
			return bad()
		}
		out.SetFloat(f)
	default:
		return fieldErr(n, path, "cannot decode into "+out.Type().String())
	}
	return nil
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func (d *decoder) describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	return d.quote(n)
}

// quote is n's value quoted for an error, or its text before expansion
// when it came from the environment.
func (d *decoder) quote(n *yaml.Node) string {
	if orig, ok := d.expanded[n]; ok {
		return fmt.Sprintf("%q (from the environment, value not shown)", truncate(orig, 60))
	}
	return fmt.Sprintf("%q", truncate(n.Value, 60))
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return t.String()
}

// cleanYAMLError drops the "yaml: unmarshal errors:" preamble.
func cleanYAMLError(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		return strings.Join(te.Errors, "; ")
	}
	return err.Error()
}
