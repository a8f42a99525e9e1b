package driver

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/crdipc/crdipc/internal/storage/blockdev"
	"github.com/crdipc/crdipc/internal/storage/fdstore"
)

// A volume's data path outlives the node plugin's process. Each staged volume's FUSE
// connection is kept by the fd holder (Options.FDHolder, crdipc fd-holder), so that when
// this process stops — a rollout, an upgrade, a crash, an OOM kill — the kernel keeps the
// connection, its mount, the loop device and the file system on it; I/O waits. The next
// process takes the connections back before it serves CSI (recoverTargets), starts each
// volume's engine and serves the connection again (blockdev.Adopt), which resends what the
// dead process had read and not answered. A graceful stop first answers what it has read
// and closes its replica sessions cleanly (releaseTargets), so the successor rebuilds
// nothing.

// keepEvery is how often the holder is checked for every staged volume's connection: a
// holder that restarted has lost them all, and gets them again.
const keepEvery = 5 * time.Second

// holderPrefix starts the names of this driver's entries in the holder:
// csi-target/<volume id>/<loop device>, e.g. csi-target/pvc-1/loop3. The loop device is in
// the name because nothing else tells the next process which one is the volume's (see
// blockdev.Exists).
const holderPrefix = "csi-target/"

func holderName(id string, s *staged) string {
	return holderPrefix + id + "/" + filepath.Base(s.export.Device())
}

// parseHolderName is the volume id and loop device (/dev/loopN) of one of our names.
func parseHolderName(name string) (id, loop string, ok bool) {
	rest, ok := strings.CutPrefix(name, holderPrefix)
	if !ok {
		return "", "", false
	}
	id, dev, ok := strings.Cut(rest, "/")
	if !ok || id == "" || !strings.HasPrefix(dev, "loop") || strings.Contains(dev, "/") {
		return "", "", false
	}
	return id, "/dev/" + dev, true
}

func (d *Driver) holder() *fdstore.Client {
	if d.o.FDHolder == "" || d.o.NodeID == "" {
		return nil
	}
	return &fdstore.Client{Path: d.o.FDHolder}
}

// keep gives the holder a descriptor of s's connection. Without it the volume still
// works, but does not outlive this process; keepLoop tries again.
func (d *Driver) keep(id string, s *staged) {
	h := d.holder()
	if h == nil {
		return
	}
	fd, err := s.export.Conn()
	if err == nil {
		err = h.Put(holderName(id, s), fd)
		unix.Close(fd)
	}
	if err != nil {
		s.kept.Store(false)
		d.log.Error(err, "the fd holder does not keep the volume's connection: a restart of this process would fail its I/O; retrying", "volume", id)
		return
	}
	s.kept.Store(true)
}

// forget drops volume id's connections from the holder. A failure leaves a stale entry,
// which the next process's recoverTargets drops.
func (d *Driver) forget(id string) {
	h := d.holder()
	if h == nil {
		return
	}
	names, err := h.List()
	for _, n := range names {
		if nid, _, ok := parseHolderName(n); ok && nid == id && err == nil {
			err = h.Delete(n)
		}
	}
	if err != nil {
		d.log.Error(err, "removing the volume's connection from the fd holder", "volume", id)
	}
}

// keepLoop re-gives the holder what it lacks, until ctx ends.
func (d *Driver) keepLoop(ctx context.Context) {
	h := d.holder()
	if h == nil {
		return
	}
	t := time.NewTicker(keepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		names, err := h.List()
		if err != nil {
			d.log.Error(err, "listing the fd holder")
			continue
		}
		held := map[string]bool{}
		for _, n := range names {
			held[n] = true
		}
		d.data.Lock()
		missing := map[string]*staged{}
		for id, s := range d.data.staged {
			if !held[holderName(id, s)] {
				missing[id] = s
			}
		}
		d.data.Unlock()
		for id, s := range missing {
			d.keep(id, s)
		}
	}
}

// recoverTargets takes over the volumes an earlier process of this driver staged, as the
// holder lists them. Each is locked (lockVolume) until it is served again, so a Node call
// for it meanwhile answers Aborted and is retried; none waits for the others.
func (d *Driver) recoverTargets(ctx context.Context) {
	h := d.holder()
	if h == nil {
		return
	}
	names, err := h.List()
	if err != nil {
		d.log.Error(err, "listing the fd holder: volumes this node staged before this process started are not served again; their I/O waits until they are unstaged or the holder is reachable")
		return
	}
	for _, n := range names {
		id, loop, ok := parseHolderName(n)
		if !ok {
			continue
		}
		done, err := d.lockVolume(id)
		if err != nil {
			continue
		}
		d.log.Info("taking over the volume's target from an earlier process", "volume", id, "device", loop)
		go func() {
			defer done()
			d.recoverTarget(ctx, id, loop, n)
		}()
	}
}

// recoverTarget serves volume id's kept connection again, retrying (with backoff, until
// ctx ends) what can recover: the API, the data certificate, a quorum of replicas.
func (d *Driver) recoverTarget(ctx context.Context, id, loop, name string) {
	start := time.Now()
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 30 * time.Second}
	for {
		err := d.adoptTarget(ctx, id, loop, name)
		switch {
		case err == nil:
			d.metrics.takeovers.Inc()
			d.log.Info("volume target taken over from an earlier process", "volume", id, "took", time.Since(start))
			return
		case errors.Is(err, blockdev.ErrNoExport), errors.Is(err, fdstore.ErrNotFound):
			// Unstaged, or torn down, while no process served it: nothing to take over.
			d.log.Info("dropping the fd holder's stale entry", "volume", id, "reason", err.Error())
			if err := d.holder().Delete(name); err != nil {
				d.log.Error(err, "removing the stale entry from the fd holder", "volume", id)
			}
			return
		}
		d.log.Error(err, "taking over the volume's target; its I/O waits meanwhile; retrying", "volume", id)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff.Step()):
		}
	}
}

// adoptTarget starts volume id's engine and serves its connection, kept under name.
func (d *Driver) adoptTarget(ctx context.Context, id, loop, name string) error {
	dir, err := d.adoptDir(id)
	if err != nil {
		return err
	}
	if err := blockdev.Exists(dir, loop); err != nil {
		return err
	}
	// A quorum may take a while after a node came back (replicas rebuilding, a pool agent
	// restarting); the volume's I/O waits either way.
	ectx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	e, tlsConf, err := d.newEngine(ectx, id)
	if err != nil {
		return err
	}
	conn, err := d.holder().Get(name)
	if err != nil {
		e.Close()
		return err
	}
	ex, err := blockdev.Adopt(ctx, e, dir, loop, conn, d.exportOptions(id))
	if err != nil {
		e.Close()
		return err
	}
	s := d.follow(id, e, ex, tlsConf)
	s.kept.Store(true)
	d.setStaged(id, s)
	return nil
}

// adoptDir is targetDir for a volume whose FUSE mount no process serves yet: the target
// directory is resolved, but not the volume's own directory, the mount point, since
// anything that stats it waits for a server.
func (d *Driver) adoptDir(id string) (string, error) {
	if err := pathElement(id); err != nil {
		return "", err
	}
	root, err := resolve(filepath.Clean(d.o.TargetDir))
	if err != nil {
		return "", err
	}
	return filepath.Join(root, id), nil
}

// releaseTargets hands every staged volume on to the next process: each export stops
// reading and answers what it read, and each engine closes its replica sessions cleanly.
// The mounts stay, kept by the holder. A volume the holder does not keep is left to die
// with the process, as it would have without a holder.
func (d *Driver) releaseTargets() {
	if d.holder() == nil {
		return
	}
	d.data.Lock()
	staged := d.data.staged
	d.data.staged = nil
	d.data.Unlock()
	for id, s := range staged {
		if !s.kept.Load() {
			d.keep(id, s)
		}
		if !s.kept.Load() {
			d.log.Info("not releasing the volume: the fd holder does not keep it; its I/O fails when this process exits", "volume", id)
			continue
		}
		s.stop()
		<-s.done
		if err := s.export.Release(); err != nil {
			d.log.Error(err, "releasing the volume's export", "volume", id)
		}
		if err := s.engine.Close(); err != nil {
			d.log.Error(err, "closing the volume's engine", "volume", id)
		}
		d.log.Info("volume target released for the next process", "volume", id)
	}
}
