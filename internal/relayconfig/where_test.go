package relayconfig_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/relayconfig"
)

// TestParseWhereErrors shows a bad where: expression fails the load,
// naming the route, the YAML line and the position inside the expression.
func TestParseWhereErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, where string
		want        []string
	}{
		{"syntax error", `payload.total >`, []string{"routes[1].where: invalid CEL expression: line 1, column 16: Syntax error", "(line 49)"}},
		{"not bool", `payload.total + 1`, []string{"routes[1].where: invalid CEL expression: line 1, column 1: the expression is of type int, not bool"}},
		{"string not bool", `topic + key`, []string{"routes[1].where", "of type string, not bool"}},
		{"unknown variable", `payload.total > 100 && tenant == "acme"`, []string{"routes[1].where", "line 1, column 24: undeclared reference to 'tenant'"}},
		{"wrong type", `headers["n"] > 1`, []string{"routes[1].where", "line 1, column 14: found no matching overload for '_>_' applied to '(string, int)'"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			yaml := edit(t, `  - topics: ["users.created"]`, "  - topics: [\"users.created\"]\n    where: '"+c.where+"'")
			_, err := relayconfig.Parse("relay.yaml", []byte(yaml), noEnv)
			if err == nil {
				t.Fatalf("Parse accepted where: %s", c.where)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

// TestParseWhere shows a valid where: reaches the engine's route, the
// description config check prints, and the sinks status counts.
func TestParseWhere(t *testing.T) {
	t.Parallel()
	where := `payload.total > 100 && headers["tenant"] == "acme"`
	yaml := edit(t, `  - topics: ["users.created"]`, "  - topics: [\"users.created\"]\n    where: '"+where+"'")
	f, err := relayconfig.Parse("relay.yaml", []byte(yaml), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	routes := f.Routes()
	if routes[1].Where != where || routes[0].Where != "" || routes[2].Where != "" {
		t.Errorf("Routes() where: %q, %q, %q; want only the second set", routes[0].Where, routes[1].Where, routes[2].Where)
	}
	// A filtered route may not apply: the next matching route's sinks
	// (here the catch-all "*") may receive the topic's events too.
	if got := f.RouteSinks("users.created"); !slices.Equal(got, []string{"hook", "mail", "console", "void"}) {
		t.Errorf("RouteSinks(users.created) = %v", got)
	}
	if got := f.RouteSinks("orders.paid"); !slices.Equal(got, []string{"events-kafka", "bus"}) {
		t.Errorf("RouteSinks(orders.paid) = %v", got)
	}
}

// TestBuildCarriesWhere shows the compiled filter reaches relay.Route.
func TestBuildCarriesWhere(t *testing.T) {
	t.Parallel()
	yaml := edit(t, `  - topics: ["users.created"]`, "  - topics: [\"users.created\"]\n    where: 'key == \"k\"'")
	f, err := relayconfig.Parse("relay.yaml", []byte(yaml), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	built, err := f.Build(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = built.Close(t.Context()) })
	rs := built.Config.Routes
	if rs[1].Where == nil || rs[1].Where.String() != `key == "k"` || rs[0].Where != nil {
		t.Fatalf("built routes' Where: %v, %v", rs[0].Where, rs[1].Where)
	}
}
