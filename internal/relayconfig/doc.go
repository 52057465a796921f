// Package relayconfig loads the relay's YAML configuration file: it expands
// ${NAME} and ${NAME:-default} references from the environment, decodes every
// section strictly (an unknown key is an error naming its path), validates
// the database, relay, log, sinks and routes sections without connecting to
// anything, and finally builds the sinks and the relay.Config.
//
// A minimal file:
//
//	database:
//	  url: postgres://postgres@localhost:5432/postgres
//	sinks:
//	  - name: console
//	    type: stdout
//	routes:
//	  - topics: ["*"]
//	    sinks: [console]
//
// Errors name the key ("relay.lease: invalid duration \"30 sec\"",
// "sinks[1] (events-kafka).brokers: ...", "routes[0].sinks[1]: unknown sink
// \"bsu\"") and never contain the database password or any sink secret.
package relayconfig
