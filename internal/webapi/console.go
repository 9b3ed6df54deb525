package webapi

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// The console: plain HTML, JavaScript and CSS, no build step, nothing
// loaded from the network.
//
//go:embed console
var consoleFS embed.FS

func consoleHandler() http.Handler {
	sub, err := fs.Sub(consoleFS, "console")
	if err != nil {
		panic(err) // the embedded directory is missing: a build error
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name := strings.TrimPrefix(r.URL.Path, "/"); name != "" {
			if fi, err := fs.Stat(sub, name); err != nil || fi.IsDir() {
				writeError(w, errorf(http.StatusNotFound, "%s %s: no such resource (see docs/rest.md)", r.Method, r.URL.Path))
				return
			}
		}
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		files.ServeHTTP(w, r)
	})
}
