package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/storage/blockdev"
)

// Names of the benches, as MeasureAll runs them and AllOptions.Skip and All.Skipped name
// them.
const (
	NameUp        = "up"
	NameFloor     = "floor"
	NameRoundTrip = "roundtrip"
	NameWebhook   = "webhook"
	NameStorage   = "storage"
	NameVolume    = "volume"
	NameScale     = "scale"
)

// Names are the benches in the order MeasureAll runs them: up first, while nothing else
// has run (its starts are CPU-bound and measure the machine with them); scale last,
// because it grows a population of up to 100,000 Books and the API server is not the same
// while and after it deletes them.
var Names = []string{NameUp, NameFloor, NameRoundTrip, NameWebhook, NameStorage, NameVolume, NameScale}

// All is every bench of one run, with when and where it ran. A bench that did not run is
// nil and named in Skipped.
type All struct {
	Date    time.Time `json:"date"`
	Machine Machine   `json:"machine"`
	// Target is what was measured: "embedded control plane", or the API server of a
	// kubeconfig. Set by the caller.
	Target string `json:"target,omitempty"`
	// Quick says the benches ran at smoke-test sizes: the figures are not for the record.
	// Set by the caller.
	Quick     bool       `json:"quick,omitempty"`
	Floor     *Floor     `json:"floor,omitempty"`
	RoundTrip *RoundTrip `json:"roundTrip,omitempty"`
	Webhook   *Webhook   `json:"webhook,omitempty"`
	Storage   *Storage   `json:"storage,omitempty"`
	Up        *Up        `json:"up,omitempty"`
	Volume    *Volume    `json:"volume,omitempty"`
	Scale     *Scale     `json:"scale,omitempty"`
	// Goals are the goals of every bench that ran (their Goals()), met or missed, in the
	// order of Names.
	Goals []Goal `json:"goals"`
	// Skipped maps a bench that did not run to why.
	Skipped map[string]string `json:"skipped,omitempty"`
	// Seconds is each bench's wall time, what it starts and cleans up included.
	Seconds map[string]float64 `json:"seconds"`
}

// Machine is the host the benches ran on (with a kubeconfig: the host of bench, not of
// the cluster).
type Machine struct {
	CPUs        int    `json:"cpus"`
	CPUModel    string `json:"cpuModel,omitempty"`
	MemoryBytes uint64 `json:"memoryBytes"`
	Kernel      string `json:"kernel"`
	GoVersion   string `json:"goVersion"`
	OS          string `json:"os"`
	Arch        string `json:"arch"`
}

// ThisMachine describes the host this process runs on; what it cannot read stays empty.
func ThisMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		m.MemoryBytes = uint64(si.Totalram) * uint64(si.Unit)
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// AllOptions size every bench of MeasureAll; options left zero are the package defaults.
type AllOptions struct {
	Up        UpOptions
	Floor     FloorOptions
	RoundTrip RoundTripOptions
	Webhook   WebhookOptions
	Storage   StorageOptions
	// Volume's Endpoint and Dir come from StartStorage when it is set.
	Volume VolumeOptions
	Scale  ScaleOptions
	// Skip names benches not to run (see Names).
	Skip []string
	// InProcess says the API server runs in this process (the embedded control plane): the
	// benches read its request counter, and scale its memory, here.
	InProcess bool
	// StartStorage, when set, starts the services the storage and volume benches measure
	// through — the operator and node agents, with driver the CSI driver too — and returns
	// the driver's endpoint, a directory on the disk of the nodes' pools for the volume
	// bench, and what stops them and removes what they made. Nil: they already run against
	// the cluster (crdipc up), and Volume.Endpoint names the driver's socket.
	StartStorage func(ctx context.Context, driver bool) (endpoint, dir string, stop func(), err error)
	// StartBooks, when set, starts the Book receiver that the scale bench's Calls go to
	// (StartBooksService) and returns what stops it. Nil: it already runs.
	StartBooks func(ctx context.Context) (stop func(), err error)
	// Done, when set, is called after each bench that ran, with the results so far.
	Done func(name string, a *All)
	// Progress, when set, is told what MeasureAll is doing.
	Progress func(format string, a ...any)
	// Getenv reads the CRDIPC_REQUIRE_* variables; nil is os.Getenv.
	Getenv func(string) string
}

// DefaultAllOptions are the package defaults of every bench: the full run takes about 30
// minutes on a 2-core machine, most of it scale growing 100,000 Books and deleting them.
func DefaultAllOptions() AllOptions {
	return AllOptions{
		Up: DefaultUpOptions, Floor: DefaultFloorOptions, RoundTrip: DefaultRoundTripOptions, Webhook: DefaultWebhookOptions,
		Storage: DefaultStorageOptions, Volume: DefaultVolumeOptions, Scale: DefaultScaleOptions,
	}
}

// QuickAllOptions shrink every bench to a few seconds, for tests and smoke runs: the
// figures say that everything works, not how fast.
func QuickAllOptions() AllOptions {
	floor := FloorOptions{Writers: []int{1, 4}, Creates: 100, Samples: 30}
	o := DefaultAllOptions()
	o.Up.Starts, o.Up.Warmup = 1, 0
	o.Floor = floor
	o.RoundTrip = RoundTripOptions{Floor: floor, Samples: 30, Senders: []int{1, 4}, Calls: 60}
	o.Webhook = WebhookOptions{Clients: 4, Deliveries: 60, Rate: 100, Samples: 50}
	o.Storage.Floor = floor
	o.Storage.Volumes, o.Storage.ThroughputVolumes, o.Storage.Creators = 10, 20, 4 // 4: a writer count of the floor
	o.Volume.VolumeSize, o.Volume.SeqSize, o.Volume.SeqIODepth = 64*mib, 8*mib, 4
	o.Volume.RandSize, o.Volume.RandRuntime, o.Volume.RandIODepth = 4*mib, time.Second, 4
	o.Volume.Rounds = 1
	o.Volume.RebuildSize, o.Volume.RebuildData = 32*mib, 8*mib
	o.Volume.DropCaches = false // a smoke run leaves the page cache of whatever else runs alone
	o.Scale = ScaleOptions{Sizes: []int{100, 300}, Writers: 8, CallSamples: 20, IdleWindow: time.Second, MinCachedObjects: 2000}
	return o
}

// ParseSkip checks bench names (see Names).
func ParseSkip(names []string) (map[string]bool, error) {
	skip := map[string]bool{}
	for _, n := range names {
		if !slices.Contains(Names, n) {
			return nil, fmt.Errorf("no bench %q: the benches are %s", n, strings.Join(Names, ", "))
		}
		skip[n] = true
	}
	return skip, nil
}

// benchClaim is the StoragePoolClaim MeasureAll creates when the cluster has too few
// Healthy pools for the storage and volume benches; they share its pools.
const benchClaim = "crdipc-bench-all"

// MeasureAll runs every bench not skipped against cfg, one after the other in the order
// of Names, each on an API server that finished deleting what the previous one created.
// The volume bench is recorded in Skipped when this host lacks fio or cannot mount volumes,
// unless CRDIPC_REQUIRE_FIO=1 or CRDIPC_REQUIRE_MOUNT=1 says it must run; any other
// failure ends the run with an error, never with partial results. cfg must allow
// unthrottled clients (QPS < 0).
func MeasureAll(ctx context.Context, cfg *rest.Config, o AllOptions) (*All, error) {
	skip, err := ParseSkip(o.Skip)
	if err != nil {
		return nil, err
	}
	defaults := DefaultAllOptions()
	orDefault(&o.Floor, defaults.Floor)
	orDefault(&o.RoundTrip, defaults.RoundTrip)
	orDefault(&o.Webhook, defaults.Webhook)
	orDefault(&o.Storage, defaults.Storage)
	orDefault(&o.Volume, defaults.Volume)
	orDefault(&o.Scale, defaults.Scale)
	if o.InProcess {
		o.RoundTrip.InProcess, o.Webhook.InProcess, o.Storage.InProcess, o.Scale.InProcess = true, true, true, true
	}
	say := o.Progress
	if say == nil {
		say = func(string, ...any) {}
	}
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}

	a := &All{Date: time.Now().UTC().Truncate(time.Second), Machine: ThisMachine(), Skipped: map[string]string{}, Seconds: map[string]float64{}}
	for n := range skip {
		a.Skipped[n] = "skipped on request"
	}
	if !skip[NameVolume] {
		why, err := volumeUnavailable(o.Volume.Fio, getenv)
		if err != nil {
			return nil, err
		}
		if why != "" {
			a.Skipped[NameVolume] = why
		}
	}
	runs := func(name string) bool { _, skipped := a.Skipped[name]; return !skipped }
	if runs(NameVolume) && o.StartStorage == nil && o.Volume.Endpoint == "" {
		return nil, errors.New("volume: no CSI driver to measure through: name its socket, or skip the volume bench")
	}

	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	// Namespaces of earlier runs still being deleted are not this run's to wait for.
	foreign, err := benchNamespaces(ctx, c)
	if err != nil {
		return nil, err
	}
	ran := false
	run := func(name string, measure func(context.Context) error) error {
		if !runs(name) {
			return nil
		}
		if ran {
			if err := settle(ctx, c, foreign, say); err != nil {
				return err
			}
		}
		ran = true
		say("%s", name)
		t := time.Now()
		if err := measure(ctx); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		a.Seconds[name] = time.Since(t).Seconds()
		if o.Done != nil {
			o.Done(name, a)
		}
		return nil
	}

	if err := run(NameUp, func(ctx context.Context) (err error) {
		a.Up, err = MeasureUp(ctx, o.Up)
		return err
	}); err != nil {
		return nil, err
	}
	if err := run(NameFloor, func(ctx context.Context) (err error) {
		a.Floor, err = MeasureFloor(ctx, cfg, o.Floor)
		return err
	}); err != nil {
		return nil, err
	}
	if err := run(NameRoundTrip, func(ctx context.Context) (err error) {
		a.RoundTrip, err = MeasureRoundTrip(ctx, cfg, o.RoundTrip)
		return err
	}); err != nil {
		return nil, err
	}
	if err := run(NameWebhook, func(ctx context.Context) (err error) {
		a.Webhook, err = MeasureWebhook(ctx, cfg, o.Webhook)
		return err
	}); err != nil {
		return nil, err
	}
	if runs(NameStorage) || runs(NameVolume) {
		if err := measureStorageAndVolume(ctx, c, cfg, &o, a, runs, run, say); err != nil {
			return nil, err
		}
	}
	if err := run(NameScale, func(ctx context.Context) (err error) {
		if o.StartBooks != nil {
			stop, err := o.StartBooks(ctx)
			if err != nil {
				return err
			}
			defer stop()
		}
		a.Scale, err = MeasureScale(ctx, cfg, o.Scale)
		return err
	}); err != nil {
		return nil, err
	}
	a.Goals = a.CollectGoals()
	return a, nil
}

// measureStorageAndVolume runs the storage and volume benches on one set of storage
// services and one claim's pools. Each bench alone would create a claim of its own and
// delete it at its end; its pools outlive it for a while (their agents delete them), so
// the next bench, on services started afresh, would wait for pools being deleted.
func measureStorageAndVolume(ctx context.Context, c client.Client, cfg *rest.Config, o *AllOptions, a *All,
	runs func(string) bool, run func(string, func(context.Context) error) error, say func(string, ...any)) (err error) {
	if o.StartStorage != nil {
		endpoint, dir, stop, err := o.StartStorage(ctx, runs(NameVolume))
		if err != nil {
			return fmt.Errorf("starting the storage services: %w", err)
		}
		defer stop()
		o.Volume.Endpoint, o.Volume.Dir = endpoint, dir
	}
	rf := int32(0)
	if runs(NameStorage) {
		rf = o.Storage.ReplicationFactor
	}
	if runs(NameVolume) {
		rf = max(rf, int32(o.Volume.ReplicationFactor))
	}
	_, deleteClaim, err := ensurePools(ctx, c, StorageOptions{ReplicationFactor: rf, ClaimName: benchClaim})
	if err != nil {
		return err
	}
	// Before the services stop: the agents delete the pools, then the operator the claim.
	defer func() { err = errors.Join(err, releaseClaim(c, deleteClaim, say)) }()
	if err := run(NameStorage, func(ctx context.Context) (err error) {
		a.Storage, err = MeasureStorage(ctx, cfg, o.Storage)
		return err
	}); err != nil {
		return err
	}
	return run(NameVolume, func(ctx context.Context) (err error) {
		a.Volume, err = MeasureVolume(ctx, cfg, o.Volume)
		return err
	})
}

// releaseClaim deletes the claim MeasureAll made, if it made one, and waits until it is
// gone with its pools.
func releaseClaim(c client.Client, deleteClaim func(), say func(string, ...any)) error {
	deleteClaim()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	claim := &storagev1alpha1.StoragePoolClaim{}
	for said := false; ; said = true {
		err := c.Get(ctx, client.ObjectKey{Name: benchClaim}, claim)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil && claim.DeletionTimestamp.IsZero() {
			// Not made by this run (deleteClaim deleted nothing): not ours to wait for.
			return nil
		}
		if !said {
			say("waiting for claim %s and its pools to be deleted", benchClaim)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("claim %s still there after 2m: %w", benchClaim, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// volumeUnavailable says why the volume bench cannot run on this host, "" if it can: fio
// missing, or no way to present volumes as block devices. A missing capability is an error
// when the matching CRDIPC_REQUIRE_* variable is 1, as CI sets it.
func volumeUnavailable(fio string, getenv func(string) string) (string, error) {
	var why []string
	if _, err := exec.LookPath(fio); err != nil {
		if getenv("CRDIPC_REQUIRE_FIO") == "1" {
			return "", fmt.Errorf("volume: CRDIPC_REQUIRE_FIO=1 but fio is missing (apt-get install fio): %w", err)
		}
		why = append(why, fmt.Sprintf("fio is missing (apt-get install fio): %v", err))
	}
	if err := blockdev.Available(); err != nil {
		if getenv("CRDIPC_REQUIRE_MOUNT") == "1" {
			return "", fmt.Errorf("volume: CRDIPC_REQUIRE_MOUNT=1 but this host cannot mount volumes: %w", err)
		}
		why = append(why, err.Error())
	}
	return strings.Join(why, "; "), nil
}

// benchNamespaces are the names of the namespaces the benches create (bench-…).
func benchNamespaces(ctx context.Context, c client.Client) (map[string]bool, error) {
	var list corev1.NamespaceList
	if err := c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	names := map[string]bool{}
	for _, ns := range list.Items {
		if strings.HasPrefix(ns.Name, "bench-") {
			names[ns.Name] = true
		}
	}
	return names, nil
}

// settleTimeout bounds the wait for a bench's namespaces to be deleted.
const settleTimeout = 10 * time.Minute

// settle waits until the namespaces the benches made, except foreign ones, are deleted:
// the benches leave thousands of objects to the namespace controller, and the next bench
// would otherwise measure an API server busy deleting them.
func settle(ctx context.Context, c client.Client, foreign map[string]bool, say func(string, ...any)) error {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	said := time.Now()
	for {
		names, err := benchNamespaces(ctx, c)
		if err != nil {
			return err
		}
		var left []string
		for n := range names {
			if !foreign[n] {
				left = append(left, n)
			}
		}
		if len(left) == 0 {
			return nil
		}
		slices.Sort(left)
		if time.Since(said) > 10*time.Second {
			say("waiting for namespaces %s to be deleted", strings.Join(left, ", "))
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespaces %s still there after %s: the next bench would measure an API server busy deleting them: %w",
				strings.Join(left, ", "), settleTimeout, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// orDefault sets *o to def when *o is the zero value.
func orDefault[T any](o *T, def T) {
	if reflect.ValueOf(o).Elem().IsZero() {
		*o = def
	}
}
