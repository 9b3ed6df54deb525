// Package line parses the input lines of the window-count example.
package line

import (
	"bytes"
	"errors"
	"strconv"
)

// Parse splits a line "key,timestamp_ms" into its key and event time. The key
// aliases line. Surrounding spaces and a trailing '\r' are ignored.
func Parse(line []byte) (key []byte, ts int64, err error) {
	line = bytes.TrimRight(line, "\r")
	i := bytes.LastIndexByte(line, ',')
	if i < 0 {
		return nil, 0, errors.New("want key,timestamp_ms")
	}
	key = bytes.TrimSpace(line[:i])
	if len(key) == 0 {
		return nil, 0, errors.New("empty key")
	}
	ts, err = strconv.ParseInt(string(bytes.TrimSpace(line[i+1:])), 10, 64)
	if err != nil {
		return nil, 0, errors.New("timestamp is not an integer")
	}
	return key, ts, nil
}
