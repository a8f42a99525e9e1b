package metricsagent

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// The checkpoint is one ConfigMap in the agent's namespace. Only the name below is granted
// get and update; create cannot be limited to a name (RBAC has no name before creation).
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;update,resourceNames=crdipc-metrics-agent-checkpoint
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=create

const (
	// DefaultCheckpointName is the checkpoint ConfigMap's name; the shipped role grants
	// get and update on this name only.
	DefaultCheckpointName = "crdipc-metrics-agent-checkpoint"
	// DefaultCheckpointInterval is how often a changed count is checkpointed.
	DefaultCheckpointInterval = 30 * time.Second

	// checkpointFormat versions the encoding below; another value is refused, not guessed at.
	checkpointFormat = "1"
	// maxSeenBytes bounds the seen set so the whole ConfigMap stays under the API server's
	// 1 MiB (keys plus values); the totals and the other keys need a few KiB at most.
	maxSeenBytes = 1<<20 - 32<<10
	// finalWriteTimeout bounds the checkpoint written on shutdown.
	finalWriteTimeout = 10 * time.Second
)

// Keys of the checkpoint ConfigMap. The state (totals, seen, horizon) is present only once
// an agent has handled a full list; a ConfigMap without it is a claim and nothing more.
const (
	keyFormat    = "format"
	keyHolder    = "holder"    // the agent process that writes it; another's write supersedes it
	keyNamespace = "namespace" // what the counted Events were listed from; "" is all namespaces
	keyWritten   = "written"   // when, for people reading it
	keyTotals    = "totals"    // JSON: [{"kind","reason","type","count"}]
	keyHorizon   = "horizon"   // RFC 3339: Events first seen at or before it are accounted for
	keySeen      = "seen"      // binaryData: per Event, uvarint(count<<1|raw) then the UID (see appendSeen)
)

// checkpointer reads and writes the checkpoint with optimistic concurrency: every write
// carries the resourceVersion of its last read or write, so a write never overwrites one it
// has not seen.
type checkpointer struct {
	cms                     corev1client.ConfigMapInterface
	namespace, name, holder string
	watching                string
	log                     *slog.Logger
	writes                  *prometheus.CounterVec

	// Only the checkpoint loop (or Start, before it runs) uses these.
	obj        *corev1.ConfigMap // as last read or written
	written    uint64            // the counter generation obj holds
	superseded bool
	full       bool // the last write left Events out (logged once, not every write)
}

func newCheckpointer(cms corev1client.ConfigMapInterface, namespace, name, watching string, log *slog.Logger, writes *prometheus.CounterVec) *checkpointer {
	host, _ := os.Hostname()
	return &checkpointer{
		cms: cms, namespace: namespace, name: name, watching: watching, log: log, writes: writes,
		holder: host + "_" + string(uuid.NewUUID()),
	}
}

func (c *checkpointer) String() string { return c.namespace + "/" + c.name }

// errCorrupt: the ConfigMap is not a checkpoint this agent can read. Starting over would
// silently reset the counter, so the agent stops and says how to start over.
var errCorrupt = errors.New("not a metrics agent checkpoint")

// claim makes this process the checkpoint's holder and returns the state it holds (nil if
// none): from here on another agent's writes conflict and it stands down. It retries until
// ctx ends, except when retrying cannot help. Forbidden is retried, as the informers retry
// it: a RoleBinding applied with the agent takes a moment to be authorized.
func (c *checkpointer) claim(ctx context.Context) (*state, error) {
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 30 * time.Second}
	for {
		s, err := c.tryClaim(ctx)
		if err == nil {
			return s, nil
		}
		if errors.Is(err, errCorrupt) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
			return nil, err
		}
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			c.log.Warn("claiming the checkpoint; retrying", "checkpoint", c.String(), "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("claiming checkpoint %s: %w (last error: %w)", c, context.Cause(ctx), err)
		case <-time.After(backoff.Step()):
		}
	}
}

func (c *checkpointer) tryClaim(ctx context.Context) (*state, error) {
	cm, err := c.cms.Get(ctx, c.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		// First start: no state to resume; Events listed now are history.
		created, err := c.cms.Create(ctx, c.claimed(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: c.name}}), metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating checkpoint %s: %w", c, err)
		}
		c.obj = created
		c.log.Info("no checkpoint yet: Events listed now are history", "checkpoint", c.String())
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading checkpoint %s: %w", c, err)
	}
	s, err := decodeCheckpoint(cm)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w; delete it to start counting afresh", c, err)
	}
	claimed := c.claimed(cm.DeepCopy())
	if s != nil && cm.Data[keyNamespace] != c.watching {
		// Its seen set covers another scope: Events outside it would look new.
		c.log.Warn("checkpoint counted another namespace: starting afresh, Events listed now are history",
			"checkpoint", c.String(), "counted", cm.Data[keyNamespace], "watching", c.watching)
		s = nil
		for _, k := range []string{keyTotals, keyHorizon, keyWritten} {
			delete(claimed.Data, k)
		}
		delete(claimed.BinaryData, keySeen)
	}
	updated, err := c.cms.Update(ctx, claimed, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("claiming checkpoint %s: %w", c, err)
	}
	c.obj = updated
	if s == nil {
		c.log.Info("checkpoint holds no state yet: Events listed now are history", "checkpoint", c.String())
		return nil, nil
	}
	var total uint64
	for _, v := range s.totals {
		total += v
	}
	c.log.Info("resuming from checkpoint", "checkpoint", c.String(), "previousHolder", cm.Data[keyHolder],
		"total", total, "events", len(s.seen), "written", cm.Data[keyWritten])
	return s, nil
}

// claimed is cm with this process as holder.
func (c *checkpointer) claimed(cm *corev1.ConfigMap) *corev1.ConfigMap {
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels["app.kubernetes.io/name"] = "crdipc-metrics-agent"
	cm.Labels["app.kubernetes.io/part-of"] = "crdipc"
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[keyFormat], cm.Data[keyHolder], cm.Data[keyNamespace] = checkpointFormat, c.holder, c.watching
	return cm
}

// write stores the counter's state if it changed since the last write. A conflict means
// someone else wrote: if another agent has claimed the checkpoint since, this one stands
// down for good (the newer agent counts everything after its claim, including what this one
// counted and did not store); otherwise it writes again over what it has now read.
func (c *checkpointer) write(ctx context.Context, counter *eventCounter) error {
	if c.superseded {
		return nil
	}
	s, first, gen := counter.snapshot()
	if gen == c.written {
		return nil
	}
	seen, horizon := encodeSeen(s.seen, first, maxSeenBytes)
	if full := !horizon.IsZero(); full != c.full && full {
		c.log.Warn("checkpoint full: the Events first seen earliest are stored as a horizon; growth of their count while no agent runs is lost",
			"checkpoint", c.String(), "events", len(s.seen), "horizon", horizon)
	}
	c.full = !horizon.IsZero()
	totals, err := encodeTotals(s.totals)
	if err != nil {
		return err
	}
	for range 3 {
		cm := c.claimed(c.obj.DeepCopy())
		cm.Data[keyTotals], cm.Data[keyWritten] = totals, time.Now().UTC().Format(time.RFC3339)
		delete(cm.Data, keyHorizon)
		if !horizon.IsZero() {
			cm.Data[keyHorizon] = horizon.UTC().Format(time.RFC3339Nano)
		}
		cm.BinaryData = map[string][]byte{keySeen: seen}

		stored, err := c.cms.Update(ctx, cm, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			// Deleted under us: write it anew, as its holder.
			cm.ObjectMeta = metav1.ObjectMeta{Namespace: c.namespace, Name: c.name, Labels: cm.Labels}
			stored, err = c.cms.Create(ctx, cm, metav1.CreateOptions{})
		}
		switch {
		case err == nil:
			c.obj, c.written = stored, gen
			c.writes.WithLabelValues("written").Inc()
			return nil
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			cur, err := c.cms.Get(ctx, c.name, metav1.GetOptions{})
			if err != nil {
				c.writes.WithLabelValues("failed").Inc()
				return fmt.Errorf("rereading checkpoint %s after a conflict: %w", c, err)
			}
			if h := cur.Data[keyHolder]; h != c.holder {
				c.superseded = true
				c.writes.WithLabelValues("superseded").Inc()
				c.log.Warn("another metrics agent holds the checkpoint now; this one counts on but no longer writes it (run one replica)",
					"checkpoint", c.String(), "holder", h)
				return nil
			}
			c.obj = cur // changed by someone else, still ours: write over it
		default:
			c.writes.WithLabelValues("failed").Inc()
			return fmt.Errorf("writing checkpoint %s: %w", c, err)
		}
	}
	c.writes.WithLabelValues("failed").Inc()
	return fmt.Errorf("writing checkpoint %s: it keeps changing under us", c)
}

// decodeCheckpoint reads a checkpoint ConfigMap; nil if it holds no state yet.
func decodeCheckpoint(cm *corev1.ConfigMap) (*state, error) {
	if f := cm.Data[keyFormat]; f != checkpointFormat {
		return nil, fmt.Errorf("%w: format %q, want %q", errCorrupt, f, checkpointFormat)
	}
	raw, ok := cm.Data[keyTotals]
	if !ok {
		return nil, nil
	}
	s := &state{}
	var err error
	if s.totals, err = decodeTotals(raw); err != nil {
		return nil, err
	}
	if s.seen, err = decodeSeen(cm.BinaryData[keySeen]); err != nil {
		return nil, err
	}
	if h := cm.Data[keyHorizon]; h != "" {
		if s.horizon, err = time.Parse(time.RFC3339Nano, h); err != nil {
			return nil, fmt.Errorf("%w: horizon: %w", errCorrupt, err)
		}
	}
	return s, nil
}

type totalEntry struct {
	labelSet
	Count uint64 `json:"count"`
}

func encodeTotals(totals map[labelSet]uint64) (string, error) {
	list := make([]totalEntry, 0, len(totals))
	for l, v := range totals {
		list = append(list, totalEntry{l, v})
	}
	slices.SortFunc(list, func(a, b totalEntry) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Type, b.Type))
	})
	b, err := json.Marshal(list)
	if err != nil {
		return "", fmt.Errorf("encoding totals: %w", err)
	}
	return string(b), nil
}

func decodeTotals(raw string) (map[labelSet]uint64, error) {
	var list []totalEntry
	if err := json.Unmarshal([]byte(raw), &list); err != nil {
		return nil, fmt.Errorf("%w: totals: %w", errCorrupt, err)
	}
	totals := make(map[labelSet]uint64, len(list))
	for _, e := range list {
		if e.Kind == "" || e.Reason == "" || e.Type == "" {
			return nil, fmt.Errorf("%w: totals: series with an empty label: %+v", errCorrupt, e)
		}
		if _, dup := totals[e.labelSet]; dup {
			return nil, fmt.Errorf("%w: totals: series %+v twice", errCorrupt, e.labelSet)
		}
		totals[e.labelSet] = e.Count
	}
	return totals, nil
}

// encodeSeen packs the seen set in at most budget bytes, newest (by first seen) first. If it
// does not fit, the oldest Events are left out, whole groups of equal first-seen times at a
// time, and horizon is the latest first-seen time left out: on resuming, an Event not in the
// set and first seen at or before it is taken as accounted for.
func encodeSeen(seen map[types.UID]int32, first map[types.UID]int64, budget int) (b []byte, horizon time.Time) {
	uids := make([]types.UID, 0, len(seen))
	for uid := range seen {
		uids = append(uids, uid)
	}
	slices.SortFunc(uids, func(x, y types.UID) int {
		return cmp.Or(cmp.Compare(first[y], first[x]), cmp.Compare(x, y))
	})
	ends := make([]int, 0, len(uids)) // ends[i]: len(b) after the first i+1 records
	for i, uid := range uids {
		r := appendSeen(nil, uid, seen[uid])
		if len(b)+len(r) > budget {
			for i > 0 && first[uids[i-1]] == first[uids[i]] {
				i--
			}
			if i == 0 {
				b = b[:0]
			} else {
				b = b[:ends[i-1]]
			}
			return b, time.Unix(0, first[uids[i]])
		}
		b = append(b, r...)
		ends = append(ends, len(b))
	}
	return b, time.Time{}
}

// appendSeen appends one Event: uvarint(count<<1) and the 16 bytes of its UID when the UID
// is a canonical UUID (the API server's are), else uvarint(count<<1|1), uvarint(len) and the
// UID's bytes. About 17 bytes an Event: some 60,000 fit.
func appendSeen(b []byte, uid types.UID, n int32) []byte {
	if u, ok := parseUUID(string(uid)); ok {
		b = binary.AppendUvarint(b, uint64(n)<<1)
		return append(b, u[:]...)
	}
	b = binary.AppendUvarint(b, uint64(n)<<1|1)
	b = binary.AppendUvarint(b, uint64(len(uid)))
	return append(b, uid...)
}

func decodeSeen(b []byte) (map[types.UID]int32, error) {
	seen := map[types.UID]int32{}
	for off := 0; off < len(b); {
		h, k := binary.Uvarint(b[off:])
		if k <= 0 {
			return nil, fmt.Errorf("%w: seen: bad count at byte %d", errCorrupt, off)
		}
		off += k
		n := h >> 1
		if n == 0 || n > math.MaxInt32 {
			return nil, fmt.Errorf("%w: seen: count %d at byte %d", errCorrupt, n, off)
		}
		var uid types.UID
		if h&1 == 0 {
			if len(b)-off < 16 {
				return nil, fmt.Errorf("%w: seen: truncated UID at byte %d", errCorrupt, off)
			}
			uid = formatUUID([16]byte(b[off : off+16]))
			off += 16
		} else {
			l, k := binary.Uvarint(b[off:])
			if k <= 0 || l == 0 || l > uint64(len(b)-off-k) {
				return nil, fmt.Errorf("%w: seen: bad UID length at byte %d", errCorrupt, off)
			}
			off += k
			uid = types.UID(b[off : off+int(l)])
			off += int(l)
		}
		if _, dup := seen[uid]; dup {
			return nil, fmt.Errorf("%w: seen: UID %s twice", errCorrupt, uid)
		}
		seen[uid] = int32(n)
	}
	return seen, nil
}

// parseUUID reads a UUID in canonical form (lower-case hex, 8-4-4-4-12), the only form that
// formatUUID gives back unchanged.
func parseUUID(s string) (u [16]byte, ok bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	h := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:]
	if strings.ToLower(h) != h {
		return u, false
	}
	if _, err := hex.Decode(u[:], []byte(h)); err != nil {
		return u, false
	}
	return u, true
}

func formatUUID(u [16]byte) types.UID {
	h := hex.EncodeToString(u[:])
	return types.UID(h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:])
}
