package driver

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// DefaultKubeletRoot is where a kubelet keeps its pods' volumes and its plugins' staging
// paths (kubelet --root-dir).
const DefaultKubeletRoot = "/var/lib/kubelet"

// errOutside is the error of a path that does not lie inside the directory it must.
var errOutside = errors.New("path escapes its root")

// underRoot checks that path lies strictly inside root and returns it resolved: the part
// that exists with its symbolic links followed, the rest (which cannot be a link yet)
// appended. A relative path, a ".." element, or a link leading out of root is refused: the
// driver mounts and removes only what a kubelet of this node could have asked for.
func underRoot(root, path string) (string, error) {
	return contained(root, path, true)
}

// contained is underRoot with a choice: follow false leaves a last element that is a
// symbolic link unfollowed, a link the driver may remove but not go through.
func contained(root, path string, follow bool) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%q is not an absolute path", path)
	}
	for _, e := range strings.Split(path, "/") {
		if e == ".." {
			return "", fmt.Errorf("%q has a \"..\" element", path)
		}
	}
	r, err := resolve(filepath.Clean(root))
	if err != nil {
		return "", err
	}
	clean := filepath.Clean(path)
	var p string
	if fi, err := os.Lstat(clean); err == nil && fi.Mode()&fs.ModeSymlink != 0 && !follow {
		dir, err := resolve(filepath.Dir(clean))
		if err != nil {
			return "", err
		}
		p = filepath.Join(dir, filepath.Base(clean))
	} else if p, err = resolve(clean); err != nil {
		return "", err
	}
	if !inside(r, p) {
		if p != clean {
			return "", fmt.Errorf("%w: %s (resolved %s) is not inside %s", errOutside, path, p, r)
		}
		return "", fmt.Errorf("%w: %s is not inside %s", errOutside, path, r)
	}
	return p, nil
}

// hostPath is the file or directory name inside root, a directory the driver owns (such as
// its target directory). name comes from the API (a volume or replica name) and must be one
// plain path element, and the result, symbolic links followed, must stay inside root.
func hostPath(root, name string) (string, error) {
	if err := pathElement(name); err != nil {
		return "", err
	}
	return underRoot(root, filepath.Join(root, name))
}

// pathElement says why name is not one plain path element.
func pathElement(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("%q is not a file name", name)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("%q is not a single path element", name)
	}
	return nil
}

// resolve follows the symbolic links of the longest existing prefix of the clean absolute
// path p and appends the rest. A link that leads nowhere is an error: whatever is made
// through it later would land where it points.
func resolve(p string) (string, error) {
	rest := ""
	for cur := p; ; {
		if _, err := os.Lstat(cur); err == nil {
			r, err := filepath.EvalSymlinks(cur)
			if err != nil {
				return "", fmt.Errorf("resolving %s: %w", cur, err)
			}
			return filepath.Join(r, rest), nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("resolving %s: %w", cur, err)
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return p, nil
		}
		rest = filepath.Join(filepath.Base(cur), rest)
		cur = parent
	}
}

// inside reports whether the clean path p lies strictly inside the clean directory root.
func inside(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}
