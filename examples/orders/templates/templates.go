// Package templates holds the email templates of the orders example:
// order_paid.txt (text/template) and order_paid.html (html/template), which
// the email sink renders from the payload of an email.order_paid event. The
// relay reads them from this directory (templates_dir in relay.yaml); FS
// embeds them for programs that run without the source tree, such as
// `go run ./examples/orders/demo`.
package templates

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// FS holds the template files, at its root.
//
//go:embed *.txt *.html
var FS embed.FS

// WriteDir copies the templates into dir (which must exist), so that the
// email sink's templates_dir can point at it.
func WriteDir(dir string) error {
	return fs.WalkDir(FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := FS.ReadFile(path)
		if err != nil {
			return fmt.Errorf("reading embedded template %s: %w", path, err)
		}
		if err := os.WriteFile(filepath.Join(dir, path), data, 0o644); err != nil {
			return fmt.Errorf("writing template %s: %w", path, err)
		}
		return nil
	})
}
