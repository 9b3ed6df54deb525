// Package all registers every connector that lives in a package of its own
// (the built-in ones register with package connector itself): import it
// for its side effects, as the streamd command does,
//
//	import _ "github.com/streamd/streamd/internal/connector/all"
//
// so that job files, validate, deploy schemes and docs/connectors.md see
// them. A new connector package adds its import here.
package all

import (
	_ "github.com/streamd/streamd/internal/connector/kafka" // kafka source, sink and the kafka:TOPIC scheme
)
