// Package mysqlurl turns Herald's MySQL database URLs,
// mysql://user:password@host:3306/database?param=value, into the
// configuration of github.com/go-sql-driver/mysql, whose own DSN format
// (user:password@tcp(host:3306)/database) is not a URL. Errors never quote
// the URL: it may hold a password.
package mysqlurl

import (
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// Scheme is the URL scheme that selects MySQL (and MariaDB).
const Scheme = "mysql"

// Is reports whether a database URL names MySQL rather than PostgreSQL.
func Is(raw string) bool {
	scheme, _, ok := strings.Cut(raw, "://")
	return ok && strings.EqualFold(scheme, Scheme)
}

// Config parses a mysql:// URL. The port defaults to 3306. Query
// parameters are the driver's (tls, timeout, interpolateParams...) or
// session variables it sets on each connection, as in its DSN; parseTime
// defaults to true and loc to UTC, so that DATETIME columns, which hold
// UTC, read as time.Time in UTC.
func Config(raw string) (*mysql.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse errors quote the URL, password included.
		return nil, errors.New("not a valid URL (percent-encode special characters in the user name and password)")
	}
	if !strings.EqualFold(u.Scheme, Scheme) {
		return nil, fmt.Errorf("scheme %q is not %s", u.Scheme, Scheme)
	}
	if u.Host == "" {
		return nil, errors.New("no host (mysql://user:password@host:3306/database)")
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "3306"
	}
	q := u.Query()
	if !q.Has("parseTime") {
		q.Set("parseTime", "true")
	}
	// The driver parses the parameters as its DSN gives them; the user,
	// password and database are set afterwards, so that no character of
	// theirs is read as DSN syntax.
	cfg, err := mysql.ParseDSN("tcp(" + net.JoinHostPort(host, port) + ")/?" + q.Encode())
	if err != nil {
		return nil, fmt.Errorf("query parameters: %w", err)
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if strings.Contains(cfg.DBName, "/") {
		return nil, fmt.Errorf("database %q: a database name has no slash", cfg.DBName)
	}
	return cfg, nil
}

// Open returns a *sql.DB on the database a mysql:// URL names (connections
// are opened lazily).
func Open(raw string) (*sql.DB, error) {
	cfg, err := Config(raw)
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(conn), nil
}
