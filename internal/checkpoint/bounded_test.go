package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/streamd/streamd/control"
)

// TestReadsAreBounded: a _metadata or a state blob that is a symlink to
// /dev/zero (or a link out of the checkpoint directory) is refused with a
// clear error instead of being read without end; a link inside the
// directory is still read.
func TestReadsAreBounded(t *testing.T) {
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero")
	}
	d := openDir(t)
	md := writeCheckpoint(t, d, control.KindCheckpoint, 3, []*SubtaskState{{SourcePosition: []byte("pos0")}, nil})
	chk := md.Location
	blob := filepath.Join(chk, md.Operators[0].Subtasks[0].Ref)

	// A blob linked to a copy of itself inside the directory is fine.
	data, err := os.ReadFile(blob)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(chk, "copy"), data, 0o644))
	must(t, os.Remove(blob))
	must(t, os.Symlink("copy", blob))
	if _, err := ReadState(md, md.Operators[0].Subtasks[0]); err != nil {
		t.Fatalf("a link within the checkpoint: %v", err)
	}
	must(t, os.Remove(blob))
	must(t, os.Symlink("/dev/zero", blob))
	for name, err := range map[string]error{
		"ReadState": func() error { _, err := ReadState(md, md.Operators[0].Subtasks[0]); return err }(),
		"Verify":    Verify(md),
	} {
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "out of the checkpoint directory") {
			t.Errorf("%s of a blob linked to /dev/zero: %v", name, err)
		}
	}

	meta := filepath.Join(chk, MetadataFile)
	must(t, os.Remove(meta))
	must(t, os.Symlink("/dev/zero", meta))
	if _, err := Resolve(chk); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), meta) {
		t.Errorf("Resolve of a _metadata linked to /dev/zero: %v", err)
	}
}
