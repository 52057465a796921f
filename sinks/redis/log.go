package redis

import (
	"context"
	"fmt"
	"log/slog"

	goredis "github.com/redis/go-redis/v9"
)

// LogLibraryTo sends go-redis's own log lines (its connection pool's
// complaints while a server is down), which it otherwise prints to stderr as
// plain text whatever the relay's log format, to l at warn level. go-redis
// keeps one logger per process, so this is process-wide: call it once, from
// main.
func LogLibraryTo(l *slog.Logger) {
	goredis.SetLogger(libraryLog{l})
}

type libraryLog struct{ l *slog.Logger }

func (g libraryLog) Printf(ctx context.Context, format string, v ...any) {
	g.l.WarnContext(ctx, "redis client", "message", fmt.Sprintf(format, v...))
}
