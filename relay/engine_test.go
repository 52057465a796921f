package relay

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestEngineKnowsNoDriver: the engine reaches the database only through
// the store interface, so that a second database is a second store, not a
// second engine. Only relay/postgres.go, the PostgreSQL entry point (New,
// PoolSize, ConfigurePool), imports pgx, and the store interface imports
// nothing of a driver.
func TestEngineKnowsNoDriver(t *testing.T) {
	allowed := map[string]bool{"postgres.go": true}
	for _, dir := range []string{".", "internal/store"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no Go files in %s", dir)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") || (dir == "." && allowed[filepath.Base(file)]) {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if strings.HasPrefix(path, "github.com/jackc/") || strings.HasSuffix(path, "/pgstore") ||
					strings.HasPrefix(path, "github.com/go-sql-driver/") {
					t.Errorf("%s imports %s: the engine reaches the database through relay/internal/store only", file, path)
				}
			}
		}
	}
}
