package streamd

import (
	"errors"
	"strconv"
)

// Context describes the subtask an Operator runs as. Open receives it; it
// stays valid for the life of the instance.
type Context struct {
	Job            string // job name
	Operator       string // operator uid
	Subtask        int    // 0-based index of this parallel instance
	Parallelism    int    // number of subtasks of the operator
	MaxParallelism int    // number of key groups
	Attempt        int    // 0 on the first run, +1 on every restart of the job
	NumInputs      int    // number of inputs of the operator
	Restored       bool   // state was restored from a checkpoint or savepoint
	Config         Config // the operator's config from the job file
}

// Config is the operator's config map from the job file, every value as text:
// strings as they are, numbers and booleans in their YAML spelling, lists and
// maps as JSON.
type Config map[string]string

// String returns the value of key, or def when the key is absent.
func (c Config) String(key, def string) string {
	if v, ok := c[key]; ok {
		return v
	}
	return def
}

// Int returns the value of key as an integer, or def when the key is absent.
// A value that is not an integer is an error that names the key.
func (c Config) Int(key string, def int64) (int64, error) {
	v, ok := c[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return def, errors.New("streamd: config " + strconv.Quote(key) + " is " + strconv.Quote(v) + ", not an integer")
	}
	return n, nil
}

// Bool returns the value of key as a boolean (true/false in any case, 1/0),
// or def when the key is absent. Any other value is an error that names the key.
func (c Config) Bool(key string, def bool) (bool, error) {
	v, ok := c[key]
	if !ok {
		return def, nil
	}
	switch v {
	case "true", "True", "TRUE", "1":
		return true, nil
	case "false", "False", "FALSE", "0":
		return false, nil
	}
	return def, errors.New("streamd: config " + strconv.Quote(key) + " is " + strconv.Quote(v) + ", not a boolean")
}
