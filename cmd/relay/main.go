// Command relay runs Herald: it migrates the outbox schema and relays outbox
// events to the configured sinks.
//
//	relay migrate up --config relay.yaml
//	relay run --config relay.yaml
//
// Exit status: 0 on success, 1 when something failed at run time (database,
// sinks), 2 for a usage or configuration error. The command line is package
// relaycmd, which a program of its own calls to add sink types.
package main

import "github.com/heraldhq/herald/relaycmd"

// version is set at build time: go build -ldflags "-X main.version=v1.2.3"
// (the Dockerfile's VERSION). When empty, the module version Go recorded
// is used (go install …@v1.2.3), and for a build from a git checkout the
// commit.
var version string

func main() { relaycmd.Main(relaycmd.WithVersion(version)) }
