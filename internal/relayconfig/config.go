package relayconfig

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.yaml.in/yaml/v3"

	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/internal/routefilter"
	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
)

// File is a parsed and validated configuration file. Load and Parse return
// it; Build turns it into sinks and a relay.Config.
type File struct {
	// Database is the database section, with DATABASE_URL applied.
	Database Database
	// Relay is the relay section as written (zero values mean defaults).
	Relay Relay
	// Log is the log section, defaults filled in.
	Log Log
	// Admin is the admin server section.
	Admin Admin
	// Tracing is the tracing section.
	Tracing Tracing

	sinks  []sinkSpec
	routes []routeSpec
	// readOnly is set by LoadReadOnly: the sinks' settings were not read,
	// so Build refuses.
	readOnly bool
	// inlineSecrets are the key paths of the secrets written in the file
	// rather than taken from the environment.
	inlineSecrets []string
	warnings      []Warning
}

// Database is the database section.
type Database struct {
	// URL is the PostgreSQL connection string (postgres:// URL or key=value
	// pairs), or a mysql://user:password@host:3306/database URL for MySQL
	// and MariaDB (only `relay migrate` serves those so far). The
	// DATABASE_URL environment variable overrides it. Required (in one of
	// the two places).
	URL sinkconfig.Secret `yaml:"url"`
	// Schema holds the outbox tables. Defaults to public.
	Schema string `yaml:"schema"`
	// Table is the outbox table's name. Defaults to outbox.
	Table string `yaml:"table"`
	// MaxConns is the size of the relay's own connection pool. Defaults to
	// relay.PoolSize of the relay's workers (workers + 3).
	MaxConns int32 `yaml:"max_conns"`
	// Capture is where the relay finds new events: table (the default)
	// claims the outbox table's rows; wal also reads the events
	// outbox_emit writes into PostgreSQL's write-ahead log, from a logical
	// replication slot (relay.CaptureWAL).
	Capture string `yaml:"capture"`
	// Slot is the replication slot capture: wal reads. Defaults to
	// herald_<schema>_<table>.
	Slot string `yaml:"slot"`
	// MaxSlotRetainedBytes bounds the WAL the slot keeps on the server:
	// the relay warns past half of it and refuses to read past it.
	// Defaults to 8GiB.
	MaxSlotRetainedBytes ByteSize `yaml:"max_slot_retained_bytes"`
}

// Relay is the relay section; each key maps to the relay.Config field of the
// same name, whose comment states the default.
type Relay struct {
	// Owner identifies this relay in leases. Defaults to host-pid-random.
	Owner string `yaml:"owner"`
	// BatchSize is the most events claimed per round trip. Defaults to 1000.
	BatchSize int `yaml:"batch_size"`
	// MaxBatchBytes bounds the payload bytes one claim loads. Defaults to
	// 64MiB.
	MaxBatchBytes ByteSize `yaml:"max_batch_bytes"`
	// MaxEventBytes is the largest payload loaded; larger events are
	// dead-lettered. Defaults to 16MiB.
	MaxEventBytes ByteSize `yaml:"max_event_bytes"`
	// Workers is the number of claim loops in this relay process, each with
	// its own block of lanes. Defaults to 2.
	Workers int `yaml:"workers"`
	// Lease is how long a relay's lanes (and so their events) stay reserved
	// without renewal. Defaults to 30s.
	Lease time.Duration `yaml:"lease"`
	// PollInterval is the longest idle wait between polls. Defaults to 1s.
	PollInterval time.Duration `yaml:"poll_interval"`
	// PollOnly disables LISTEN/NOTIFY. Defaults to false.
	PollOnly bool `yaml:"poll_only"`
	// MaxAttempts is the attempts per sink for rows that set none.
	// Defaults to 10.
	MaxAttempts int `yaml:"max_attempts"`
	// Backoff spaces retries of a failed event. Defaults to 1s doubling to
	// 10m with 20% jitter.
	Backoff Backoff `yaml:"backoff"`
	// SinkPause spaces probes of a sink that is down. Defaults to 100ms
	// doubling to 5s with 20% jitter.
	SinkPause Backoff `yaml:"sink_pause"`
	// PublishTimeout bounds one publish call. Defaults to lease/2.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// HandOffAfter is the longest a batch waits for its sinks' answers;
	// events unanswered then stay in flight, in their sink's queue.
	// Defaults to 50ms.
	HandOffAfter time.Duration `yaml:"hand_off_after"`
	// MaxInFlight bounds the events each sink has in flight. Defaults to
	// twice batch_size.
	MaxInFlight int `yaml:"max_in_flight"`
	// Retention keeps delivered rows this long. Defaults to 0 (deleted at
	// once).
	Retention time.Duration `yaml:"retention"`
	// StopKeyOnDeadLetter holds back a key after one of its events is
	// dead-lettered. Defaults to false.
	StopKeyOnDeadLetter bool `yaml:"stop_key_on_dead_letter"`
	// ShutdownTimeout bounds finishing in-flight work on shutdown.
	// Defaults to 30s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// MetricsTopics are the topic patterns measured one by one in metrics
	// and published counts; other topics are counted as "(other)". Defaults
	// to the routes' patterns.
	MetricsTopics []string `yaml:"metrics_topics"`
}

// ByteSize is a number of bytes, written as an integer or with a binary
// unit: 512KiB, 64MiB, 1GiB (KB, MB and GB are read as the same units).
type ByteSize int64

// Backoff is an exponential backoff section.
type Backoff struct {
	// Initial is the first delay.
	Initial time.Duration `yaml:"initial"`
	// Max caps the delay.
	Max time.Duration `yaml:"max"`
	// Multiplier grows the delay each attempt. Defaults to 2.
	Multiplier float64 `yaml:"multiplier"`
	// Jitter randomises each delay by ± this fraction, from 0 (none) to
	// below 1. Defaults to 0.2 when absent.
	Jitter *float64 `yaml:"jitter"`
}

func (b Backoff) config() relay.Backoff {
	out := relay.Backoff{Initial: b.Initial, Max: b.Max, Multiplier: b.Multiplier}
	if b.Jitter != nil {
		out.Jitter = *b.Jitter
		if out.Jitter == 0 {
			out.Jitter = -1 // relay.Backoff's way of saying none
		}
	}
	return out
}

func (b Backoff) validate(field string) error {
	if b.Jitter != nil && (*b.Jitter < 0 || *b.Jitter >= 1) {
		return fmt.Errorf("%s.jitter: must be at least 0 and below 1, got %g", field, *b.Jitter)
	}
	return nil
}

// sinkSpec is one validated entry of the sinks list.
type sinkSpec struct {
	name, typ string
	newSink   newSinkFunc
}

// routeSpec is one validated entry of the routes list.
type routeSpec struct {
	topics  []string
	where   *routefilter.Filter // nil: none
	targets []targetSpec
}

type targetSpec struct {
	sink        string
	destination *template.Template
	// source is the destination template as written ("" for none).
	source string
}

// rawFile is the file's top level as decoded; sinks and routes are decoded
// by hand because their shape depends on their content.
type rawFile struct {
	Database Database  `yaml:"database"`
	Relay    Relay     `yaml:"relay"`
	Log      Log       `yaml:"log"`
	Admin    Admin     `yaml:"admin"`
	Tracing  Tracing   `yaml:"tracing"`
	Sinks    yaml.Node `yaml:"sinks"`
	Routes   yaml.Node `yaml:"routes"`
}

type rawRoute struct {
	Topics []string    `yaml:"topics"`
	Where  string      `yaml:"where"`
	Sinks  []yaml.Node `yaml:"sinks"`
}

type rawTarget struct {
	Name        string `yaml:"name"`
	Destination string `yaml:"destination"`
}

// maxFileSize bounds what Load reads: a configuration is a few kilobytes.
const maxFileSize = 4 << 20

// Load reads, expands and validates the configuration file at path without
// connecting to anything. env looks up environment variables for ${NAME}
// references and DATABASE_URL; nil means os.LookupEnv. Errors name the file
// and the key ("relay.lease: invalid duration ...") and never hold secrets.
func Load(path string, env func(string) (string, bool)) (*File, error) {
	return Loader{}.Load(path, env)
}

// LoadReadOnly is Load for commands that only read the outbox tables
// (status, dlq, migrate): it reads the database and log sections, the
// routes, and each sink's name and type. The relay, admin and tracing
// sections and the sinks' own settings are not read at all, so their
// ${VAR}s (an admin token, webhook secrets) need not be set and their
// values are not checked. The File it returns cannot Build.
func LoadReadOnly(path string, env func(string) (string, bool)) (*File, error) {
	return Loader{}.LoadReadOnly(path, env)
}

// Parse is Load for a configuration already in memory; name is used in
// errors.
func Parse(name string, data []byte, env func(string) (string, bool)) (*File, error) {
	return Loader{}.Parse(name, data, env)
}

// Loader reads configuration files whose sinks may be of types beyond the
// built-in ones. The zero Loader knows the built-in types only.
type Loader struct {
	// SinkTypes are the added sink types, by the value of a sink entry's
	// type key. A name of a built-in type is an error.
	SinkTypes map[string]SinkType
}

// Load is the package's Load with the Loader's sink types.
func (l Loader) Load(path string, env func(string) (string, bool)) (*File, error) {
	return l.load(path, env, false)
}

// LoadReadOnly is the package's LoadReadOnly with the Loader's sink types.
func (l Loader) LoadReadOnly(path string, env func(string) (string, bool)) (*File, error) {
	return l.load(path, env, true)
}

// Parse is the package's Parse with the Loader's sink types.
func (l Loader) Parse(name string, data []byte, env func(string) (string, bool)) (*File, error) {
	if env == nil {
		env = os.LookupEnv
	}
	f, err := l.parse(data, env, false)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", name, err)
	}
	return f, nil
}

func (l Loader) load(path string, env func(string) (string, bool), readOnly bool) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading config %s: %w", path, err)
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("config %s: larger than %d bytes", path, maxFileSize)
	}
	if env == nil {
		env = os.LookupEnv
	}
	file, err := l.parse(data, env, readOnly)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading config %s: %w", path, err)
	}
	if w, ok := readableSecrets(path, info.Mode(), file.inlineSecrets); ok {
		file.warnings = append(file.warnings, w)
	}
	return file, nil
}

func (l Loader) parse(data []byte, env func(string) (string, bool), readOnly bool) (*File, error) {
	for name := range l.SinkTypes {
		if _, builtIn := sinkTypes[name]; builtIn {
			return nil, fmt.Errorf("sink type %s: already a built-in type", name)
		}
	}
	root, err := parseYAML(data)
	if err != nil {
		return nil, err
	}
	if readOnly {
		pruneForReading(root)
	}
	d := &decoder{readOnly: readOnly, sinkTypes: l.SinkTypes, expanded: map[*yaml.Node]string{}, fromEnv: map[*yaml.Node]bool{}}
	if err := d.expandNode(root, "", env); err != nil {
		return nil, err
	}
	var raw rawFile
	if err := d.decode(root, reflect.ValueOf(&raw).Elem(), ""); err != nil {
		return nil, err
	}
	f := &File{Database: raw.Database, Relay: raw.Relay, Log: raw.Log.withDefaults(), Admin: raw.Admin, Tracing: raw.Tracing, readOnly: readOnly}
	if v, ok := env("DATABASE_URL"); ok && v != "" {
		f.Database.URL = sinkconfig.Secret(v)
	}
	if err := validateDatabaseURL(f.Database.URL.Reveal()); err != nil {
		return nil, err
	}
	if err := f.Tables().Validate(); err != nil {
		return nil, err
	}
	if f.Database.MaxConns < 0 || f.Database.MaxConns > 1000 {
		return nil, fmt.Errorf("database.max_conns: must be between 1 and 1000, got %d", f.Database.MaxConns)
	}
	if f.Database.Capture == string(relay.CaptureWAL) && mysqlurl.Is(f.Database.URL.Reveal()) {
		return nil, fmt.Errorf("database.capture: wal reads PostgreSQL's write-ahead log; MySQL's binary log is not read (use capture: table)")
	}
	if err := f.Log.validate(); err != nil {
		return nil, err
	}
	if err := f.Admin.validate(); err != nil {
		return nil, err
	}
	if err := f.Tracing.validate(); err != nil {
		return nil, err
	}
	if err := f.Relay.Backoff.validate("relay.backoff"); err != nil {
		return nil, err
	}
	if err := f.Relay.SinkPause.validate("relay.sink_pause"); err != nil {
		return nil, err
	}
	if f.sinks, err = d.parseSinks(&raw.Sinks); err != nil {
		return nil, err
	}
	if f.routes, err = d.parseRoutes(&raw.Routes, f.sinks); err != nil {
		return nil, err
	}
	// Validate the relay settings and routes as the engine will, with
	// placeholder sinks standing in for those Build creates.
	placeholders := map[string]sinks.Sink{}
	for _, s := range f.sinks {
		placeholders[s.name] = sinks.NewDiscard(s.name)
	}
	if err := f.relayConfig(placeholders).WithDefaults().Validate(); err != nil {
		return nil, err
	}
	// A connection string is a secret only for its password.
	hasPassword := urlPassword(raw.Database.URL.Reveal()) != ""
	for _, p := range d.inlineSecrets {
		if p != "database.url" || hasPassword {
			f.inlineSecrets = append(f.inlineSecrets, p)
		}
	}
	return f, nil
}

// pruneForReading removes from the document what LoadReadOnly does not
// read, before ${VAR}s are expanded: the relay, admin and tracing sections
// and every key of a sink entry but its name and type.
func pruneForReading(root *yaml.Node) {
	if root.Kind != yaml.DocumentNode || len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return // parse reports what is wrong with the document
	}
	top := root.Content[0]
	kept := top.Content[:0]
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		switch k.Value {
		case "relay", "admin", "tracing":
			continue
		case "sinks":
			if v.Kind == yaml.SequenceNode {
				for _, entry := range v.Content {
					keepKeys(entry, "name", "type")
				}
			}
		}
		kept = append(kept, k, v)
	}
	top.Content = kept
}

// keepKeys removes from a mapping every key but those named.
func keepKeys(m *yaml.Node, names ...string) {
	if m.Kind != yaml.MappingNode {
		return
	}
	kept := m.Content[:0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		if slices.Contains(names, m.Content[i].Value) {
			kept = append(kept, m.Content[i], m.Content[i+1])
		}
	}
	m.Content = kept
}

func parseYAML(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the file is empty")
		}
		return nil, fmt.Errorf("invalid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("the file must hold exactly one YAML document")
	}
	if len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("the file must be a YAML mapping (database:, relay:, log:, admin:, tracing:, sinks:, routes:)")
	}
	return &root, nil
}

func validateDatabaseURL(conn string) error {
	if conn == "" {
		return errors.New("database.url: required (or set DATABASE_URL)")
	}
	if strings.Contains(conn, "://") {
		u, err := url.Parse(conn)
		if err != nil {
			// url.Parse errors quote the URL, password included.
			return errors.New("database.url: not a valid URL (percent-encode special characters in the user name and password)")
		}
		if mysqlurl.Is(conn) {
			// The MySQL store: `relay migrate` serves it, the relay engine
			// does not yet (cmd/relay says so).
			if _, err := mysqlurl.Config(conn); err != nil {
				return fmt.Errorf("database.url: %s", ScrubPassword(err.Error(), conn))
			}
			return nil
		}
		if u.Scheme != "postgres" && u.Scheme != "postgresql" {
			return fmt.Errorf("database.url: scheme %q is not postgres, postgresql or mysql", truncate(u.Scheme, 20))
		}
	}
	if _, err := pgconn.ParseConfig(conn); err != nil {
		return fmt.Errorf("database.url: %s", ScrubPassword(err.Error(), conn))
	}
	return nil
}

var sinkName = regexp.MustCompile(`^[a-z0-9_.-]{1,100}$`)

func (d *decoder) parseSinks(n *yaml.Node) ([]sinkSpec, error) {
	if n.Kind == 0 || isNull(n) {
		return nil, errors.New("sinks: at least one sink is required")
	}
	if n.Kind != yaml.SequenceNode {
		return nil, fieldErr(n, "sinks", "expected a list, got "+d.describe(n))
	}
	if len(n.Content) == 0 {
		return nil, fieldErr(n, "sinks", "at least one sink is required")
	}
	var specs []sinkSpec
	defined := map[string]int{}
	for i, entry := range n.Content {
		path := fmt.Sprintf("sinks[%d]", i)
		if entry.Kind == yaml.AliasNode {
			return nil, fieldErr(entry, path, "YAML aliases (*name) are not supported")
		}
		if entry.Kind != yaml.MappingNode {
			return nil, fieldErr(entry, path, "expected a mapping with name and type, got "+d.describe(entry))
		}
		var name, typ *yaml.Node
		rest := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: entry.Line, Column: entry.Column}
		for j := 0; j+1 < len(entry.Content); j += 2 {
			k, v := entry.Content[j], entry.Content[j+1]
			var dst **yaml.Node
			switch k.Value {
			case "name":
				dst = &name
			case "type":
				dst = &typ
			default:
				rest.Content = append(rest.Content, k, v)
				continue
			}
			if *dst != nil {
				return nil, fieldErr(k, path+"."+k.Value, "duplicate key")
			}
			if v.Kind != yaml.ScalarNode || isNull(v) {
				return nil, fieldErr(v, path+"."+k.Value, "expected a string, got "+d.describe(v))
			}
			*dst = v
		}
		switch {
		case name == nil || name.Value == "":
			return nil, fieldErr(entry, path+".name", "required")
		case !sinkName.MatchString(name.Value):
			return nil, fieldErr(name, path+".name", d.quote(name)+" must be 1 to 100 of a-z 0-9 _ . -")
		}
		if prev, dup := defined[name.Value]; dup {
			return nil, fieldErr(name, path+".name", fmt.Sprintf("%s is already the name of sinks[%d]", d.quote(name), prev))
		}
		defined[name.Value] = i
		if typ == nil || typ.Value == "" {
			return nil, fieldErr(entry, path+".type", fmt.Sprintf("required (known: %s)", strings.Join(d.knownSinkTypes(), ", ")))
		}
		st, ok := d.sinkType(typ.Value)
		if !ok {
			return nil, fieldErr(typ, path+".type", fmt.Sprintf("unknown sink type %s (known: %s)", d.quote(typ), strings.Join(d.knownSinkTypes(), ", ")))
		}
		var newSink newSinkFunc
		if !d.readOnly {
			var err error
			if newSink, err = st(d, rest, fmt.Sprintf("%s (%s)", path, name.Value)); err != nil {
				return nil, err
			}
		}
		specs = append(specs, sinkSpec{name: name.Value, typ: typ.Value, newSink: newSink})
	}
	return specs, nil
}

// sampleDestination is the event a destination template is tried on at load
// time, to catch misspelt fields.
var sampleDestination = relay.DestinationData{
	ID: "00000000-0000-0000-0000-000000000000", Topic: "topic", Key: "key", Headers: map[string]string{},
}

func (d *decoder) parseRoutes(n *yaml.Node, specs []sinkSpec) ([]routeSpec, error) {
	var raw []rawRoute
	if n.Kind != 0 {
		if err := d.decode(n, reflect.ValueOf(&raw).Elem(), "routes"); err != nil {
			return nil, err
		}
	}
	if len(raw) == 0 {
		return nil, errors.New("routes: at least one route is required")
	}
	defined := map[string]bool{}
	for _, s := range specs {
		defined[s.name] = true
	}
	routes := make([]routeSpec, len(raw))
	for i, r := range raw {
		routes[i].topics = r.Topics
		if r.Where != "" {
			f, err := routefilter.Compile(r.Where)
			if err != nil {
				// The YAML line is the route's; the CEL line and column,
				// in the message, are within the expression.
				return nil, fieldErr(valueNode(n.Content[i], "where"), fmt.Sprintf("routes[%d].where", i), "invalid CEL expression: "+err.Error())
			}
			routes[i].where = f
		}
		for j, tn := range r.Sinks {
			path := fmt.Sprintf("routes[%d].sinks[%d]", i, j)
			var t rawTarget
			switch tn.Kind {
			case yaml.ScalarNode:
				t.Name = tn.Value
			case yaml.MappingNode:
				if err := d.decode(&tn, reflect.ValueOf(&t).Elem(), path); err != nil {
					return nil, err
				}
			default:
				return nil, fieldErr(&tn, path, "expected a sink name or {name, destination}, got "+d.describe(&tn))
			}
			if t.Name == "" {
				return nil, fieldErr(&tn, path, "sink name required")
			}
			if !defined[t.Name] {
				return nil, fieldErr(&tn, path, fmt.Sprintf("unknown sink %q", truncate(t.Name, 60)))
			}
			target := targetSpec{sink: t.Name}
			if t.Destination != "" {
				dpath := fmt.Sprintf("%s (%s).destination", path, t.Name)
				tmpl, err := template.New(dpath).Option("missingkey=error").Parse(t.Destination)
				if err != nil {
					return nil, fieldErr(&tn, dpath, "invalid template: "+err.Error())
				}
				if err := tmpl.Execute(io.Discard, sampleDestination); err != nil && !strings.Contains(err.Error(), "map has no entry for key") {
					return nil, fieldErr(&tn, dpath, "invalid template (fields are .ID, .Topic, .Key, .Headers): "+err.Error())
				}
				target.destination, target.source = tmpl, t.Destination
			}
			routes[i].targets = append(routes[i].targets, target)
		}
	}
	return routes, nil
}

// valueNode returns the value of key in mapping m, or m when it has none,
// for the line an error points at.
func valueNode(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return m
}

// relayConfig assembles the engine's configuration with the given sinks.
func (f *File) relayConfig(byName map[string]sinks.Sink) relay.Config {
	r := f.Relay
	cfg := relay.Config{
		Tables:               f.Tables(),
		Owner:                r.Owner,
		BatchSize:            r.BatchSize,
		MaxBatchBytes:        int64(r.MaxBatchBytes),
		MaxEventBytes:        int64(r.MaxEventBytes),
		Workers:              r.Workers,
		Lease:                r.Lease,
		PollInterval:         r.PollInterval,
		PollOnly:             r.PollOnly,
		MaxAttempts:          r.MaxAttempts,
		Backoff:              r.Backoff.config(),
		SinkPause:            r.SinkPause.config(),
		PublishTimeout:       r.PublishTimeout,
		HandOffAfter:         r.HandOffAfter,
		MaxInFlight:          r.MaxInFlight,
		Retention:            r.Retention,
		StopKeyOnDeadLetter:  r.StopKeyOnDeadLetter,
		ShutdownTimeout:      r.ShutdownTimeout,
		MetricsTopics:        r.MetricsTopics,
		Capture:              relay.Capture(f.Database.Capture),
		Slot:                 f.Database.Slot,
		MaxSlotRetainedBytes: int64(f.Database.MaxSlotRetainedBytes),
	}
	for _, rs := range f.routes {
		route := relay.Route{Topics: rs.topics, Where: rs.where}
		for _, t := range rs.targets {
			route.Targets = append(route.Targets, relay.Target{Sink: byName[t.sink], Destination: t.destination})
		}
		cfg.Routes = append(cfg.Routes, route)
	}
	return cfg
}

// DatabaseURL returns the connection string (DATABASE_URL when set). Print
// it only through RedactURL.
func (f *File) DatabaseURL() string { return f.Database.URL.Reveal() }

// MaxConns returns the size of the relay's connection pool: database.max_conns,
// or relay.PoolSize of its workers.
func (f *File) MaxConns() int32 {
	if f.Database.MaxConns > 0 {
		return f.Database.MaxConns
	}
	return relay.PoolSize(relay.Config{Workers: f.Relay.Workers, Capture: relay.Capture(f.Database.Capture)}.WithDefaults().Workers)
}

// Tables returns the outbox tables named by the database section, defaults
// filled in.
func (f *File) Tables() migrations.Tables {
	return migrations.Tables{Schema: f.Database.Schema, Table: f.Database.Table}.WithDefaults()
}

// RouteSinks returns the names of the sinks an event of topic may be sent
// to: those of the first route matching topic, and, when that route has a
// where filter (so the route depends on the event), those of the later
// matching routes up to the first without one. Nil when no route matches.
func (f *File) RouteSinks(topic string) []string {
	var names []string
	for _, r := range f.routes {
		if !slices.ContainsFunc(r.topics, func(p string) bool { return relay.MatchTopic(p, topic) }) {
			continue
		}
		for _, t := range r.targets {
			if !slices.Contains(names, t.sink) {
				names = append(names, t.sink)
			}
		}
		if r.where == nil {
			break
		}
	}
	return names
}

// Route describes a route of the file for people (relay config check).
type Route struct {
	// Topics are the route's topic patterns.
	Topics []string
	// Where is the route's filter as written; empty means none.
	Where string
	// Targets are the route's sinks, in order.
	Targets []RouteTarget
}

// RouteTarget is one sink of a Route.
type RouteTarget struct {
	// Sink and Type name the sink and its type.
	Sink, Type string
	// Destination is the destination template as written; empty means
	// the event's topic.
	Destination string
}

// Routes returns the routes in file order, the first matching applying.
func (f *File) Routes() []Route {
	types := map[string]string{}
	for _, s := range f.sinks {
		types[s.name] = s.typ
	}
	out := make([]Route, len(f.routes))
	for i, r := range f.routes {
		out[i].Topics = slices.Clone(r.topics)
		if r.where != nil {
			out[i].Where = r.where.String()
		}
		for _, t := range r.targets {
			out[i].Targets = append(out[i].Targets, RouteTarget{Sink: t.sink, Type: types[t.sink], Destination: t.source})
		}
	}
	return out
}

// SinkNames returns the names of the configured sinks, in file order.
func (f *File) SinkNames() []string {
	names := make([]string, len(f.sinks))
	for i, s := range f.sinks {
		names[i] = s.name
	}
	return names
}

// prefixErr puts the sink entry's path in front of a sink Validate error
// ("brokers: ..." becomes "sinks[1] (events-kafka).brokers: ..."), line by
// line for errors joined with errors.Join.
func prefixErr(prefix string, err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		parts := j.Unwrap()
		msgs := make([]string, len(parts))
		for i, p := range parts {
			msgs[i] = p.Error()
		}
		if len(parts) > 1 && strings.Join(msgs, "\n") == err.Error() {
			out := make([]error, len(parts))
			for i, p := range parts {
				out[i] = prefixErr(prefix, p)
			}
			return errors.Join(out...)
		}
	}
	return fmt.Errorf("%s.%w", prefix, err)
}
