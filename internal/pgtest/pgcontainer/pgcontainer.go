// Package pgcontainer, imported for its side effect, makes pgtest start a
// throwaway PostgreSQL container (testcontainers-go) when no server answers
// at DATABASE_URL and a Docker engine does:
//
//	import _ "github.com/heraldhq/herald/internal/pgtest/pgcontainer"
package pgcontainer

import (
	"context"
	"fmt"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/heraldhq/herald/internal/pgtest"
)

// Image is the PostgreSQL image started.
const Image = "postgres:17-alpine"

func init() {
	pgtest.SetFallback(start)
}

// start runs Image when a Docker engine answers. The container is left to
// testcontainers' reaper, which removes it when the test process ends.
func start(ctx context.Context) (string, error) {
	if _, err := testcontainers.NewDockerClientWithOpts(ctx); err != nil {
		return "", fmt.Errorf("no Docker engine: %w", err)
	}
	ctr, err := tcpostgres.Run(ctx, Image,
		tcpostgres.WithDatabase("test"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		return "", fmt.Errorf("starting %s: %w", Image, err)
	}
	return ctr.ConnectionString(ctx, "sslmode=disable")
}
