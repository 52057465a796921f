package relayconfig

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// expandNode replaces ${NAME} and ${NAME:-default} in every scalar value
// under n (not in mapping keys, not in comments, which the YAML parser keeps
// apart). Each value is expanded once, left to right: text coming from a
// variable is never scanned again, so a variable cannot inject another
// reference or YAML structure. Plain scalars whose text changed have their
// tag resolved again, so "batch_size: ${BATCH}" decodes as an integer.
//
// The original text of every changed value is recorded in d.expanded, and
// the values that took their text from the environment in d.fromEnv.
func (d *decoder) expandNode(n *yaml.Node, path string, env func(string) (string, bool)) error {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if err := d.expandNode(c, path, env); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := d.expandNode(n.Content[i+1], joinKey(path, n.Content[i].Value), env); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if err := d.expandNode(c, fmt.Sprintf("%s[%d]", path, i), env); err != nil {
				return err
			}
		}
	case yaml.ScalarNode:
		out, fromEnv, err := expand(n.Value, env)
		if err != nil {
			return fieldErr(n, path, err.Error())
		}
		if fromEnv {
			d.fromEnv[n] = true
		}
		if out != n.Value {
			d.expanded[n] = n.Value
			n.Value = out
			if n.Style&(yaml.TaggedStyle|yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) == 0 {
				n.Tag = "" // resolved again from the expanded text
			}
		}
	}
	// Aliases are not followed: the anchored node is expanded where it is
	// defined (and aliases are refused when decoding).
	return nil
}

// expand performs the substitution on one value. "$${" stands for a literal
// "${"; a "$" not followed by "{" is kept as is. fromEnv reports whether
// the value took text from the environment and none from a default written
// in the file: a secret given so is not written in the file.
func expand(s string, env func(string) (string, bool)) (out string, fromEnv bool, err error) {
	if !strings.Contains(s, "${") {
		return s, false, nil
	}
	var b strings.Builder
	fromVars, fromDefaults := false, false
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), fromVars && !fromDefaults, nil
		}
		if i > 0 && s[i-1] == '$' {
			b.WriteString(s[:i]) // "$${" keeps one "$" (already written) and "{"
			b.WriteString("{")
			s = s[i+2:]
			continue
		}
		b.WriteString(s[:i])
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", false, fmt.Errorf("unterminated ${ (write $${ for a literal ${)")
		}
		ref := s[i+2 : i+end]
		s = s[i+end+1:]
		name, def, hasDefault := strings.Cut(ref, ":-")
		if !validEnvName(name) {
			return "", false, fmt.Errorf("%q is not a valid environment variable name in ${...}", truncate(name, 40))
		}
		v, ok := env(name)
		switch {
		case hasDefault && (!ok || v == ""):
			b.WriteString(def)
			fromDefaults = fromDefaults || def != ""
		case !ok:
			return "", false, fmt.Errorf("environment variable %s is not set (write ${%s:-default} to give a default)", name, name)
		default:
			b.WriteString(v)
			fromVars = true
		}
	}
}

func validEnvName(name string) bool {
	if name == "" {
		return false
	}
	for i, r := range name {
		switch {
		case r == '_', r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
