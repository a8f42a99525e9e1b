package console

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	"github.com/crdipc/crdipc/api/conditions"
	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/simnode"
)

// Caps on what one snapshot lists; what is left off is counted in Snapshot.Omitted.
const (
	maxNodes      = 100
	maxPools      = 50 // per node
	maxReplicas   = 100
	maxVolumes    = 100
	maxInFlight   = 50
	maxDeliveries = 20
	maxSCM        = 10
	maxNetworks   = 20
	maxBackups    = 50
	maxUsers      = 10 // pods per volume
)

// Snapshot is one message on the event stream: everything the page shows.
type Snapshot struct {
	Time         time.Time      `json:"time"`
	Nodes        []Node         `json:"nodes"`
	Volumes      []Volume       `json:"volumes"`
	InFlight     []Request      `json:"inFlight"`
	Completed    []Completion   `json:"completed"`
	Deliveries   []Delivery     `json:"deliveries"`
	PullRequests []PullRequest  `json:"pullRequests"`
	Branches     []Branch       `json:"branches"`
	Networks     []Network      `json:"networks"`
	Backups      []Backup       `json:"backups"`
	Omitted      map[string]int `json:"omitted,omitempty"`
	// Tracing says the console serves traces (GET /traces/<id>): the page links requests'
	// trace IDs only then.
	Tracing bool `json:"tracing"`
}

// Node is a Node with the pools on it.
type Node struct {
	Name      string `json:"name"`
	Ready     bool   `json:"ready"`
	Simulated bool   `json:"simulated,omitempty"`
	// Gone: pools still name this node, but the Node object is deleted.
	Gone  bool   `json:"gone,omitempty"`
	Pools []Pool `json:"pools"`
}

// Pool is a CStorPool with its replicas.
type Pool struct {
	Name     string    `json:"name"`
	Claim    string    `json:"claim,omitempty"`
	Phase    string    `json:"phase"`
	Total    string    `json:"total,omitempty"`
	Used     string    `json:"used,omitempty"`
	Replicas []Replica `json:"replicas"`
}

// Replica is a CStorVolumeReplica.
type Replica struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Volume    string   `json:"volume"`
	Phase     string   `json:"phase"`
	Used      string   `json:"used,omitempty"`
	Rebuild   *Rebuild `json:"rebuild,omitempty"`
}

// Rebuild is a replica's rebuild in progress.
type Rebuild struct {
	Source string `json:"source,omitempty"`
	// Percent is done/total bytes, or -1 before the total is known.
	Percent  float64 `json:"percent"`
	Progress string  `json:"progress,omitempty"`
	Error    string  `json:"error,omitempty"`
}

// Volume is a CStorVolume and who uses it.
type Volume struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     string `json:"phase"`
	Ready     int32  `json:"ready"`
	Desired   int32  `json:"desired"`
	Capacity  string `json:"capacity"`
	Message   string `json:"message,omitempty"`
	// Claim is the PersistentVolumeClaim it was provisioned for (CSI: pvc-<uid>).
	Claim string `json:"claim,omitempty"`
	// Published are the nodes the CSI driver attached it to.
	Published []string     `json:"published,omitempty"`
	Users     []VolumeUser `json:"users,omitempty"`
}

// VolumeUser is a pod mounting a volume's claim.
type VolumeUser struct {
	Pod   string `json:"pod"`
	Node  string `json:"node,omitempty"`
	Phase string `json:"phase"`
}

// Request is a request in flight.
type Request struct {
	Kind      string    `json:"kind"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name"`
	Reason    string    `json:"reason,omitempty"`
	Message   string    `json:"message,omitempty"`
	Since     time.Time `json:"since"`
	// TraceID is the trace of the request's latest call (see Completion.TraceID).
	TraceID string `json:"traceId,omitempty"`
}

// Delivery is a GitHub webhook delivery, as the Event the listener wrote for it.
type Delivery struct {
	Time     time.Time `json:"time"`
	Delivery string    `json:"delivery,omitempty"`
	Reason   string    `json:"reason"`
	Kind     string    `json:"kind"`
	Object   string    `json:"object"`
	Message  string    `json:"message,omitempty"`
}

// PullRequest is the state the webhook listener keeps of a pull request.
type PullRequest struct {
	Name       string `json:"name"`
	Repository string `json:"repository"`
	Number     int64  `json:"number"`
	User       string `json:"user"`
	State      string `json:"state"`
	Merged     bool   `json:"merged,omitempty"`
}

// Branch is the state the webhook listener keeps of a branch.
type Branch struct {
	Name       string `json:"name"`
	Repository string `json:"repository"`
	Branch     string `json:"branch"`
	State      string `json:"state"`
}

// Network is a BitcoinNetwork with its nodes and peer links.
type Network struct {
	Namespace  string   `json:"namespace"`
	Name       string   `json:"name"`
	Nodes      int32    `json:"nodes"`
	ReadyNodes int32    `json:"readyNodes"`
	Peers      int32    `json:"peers"`
	Ready      bool     `json:"ready"`
	Reason     string   `json:"reason,omitempty"`
	Message    string   `json:"message,omitempty"`
	Members    []Member `json:"members,omitempty"`
}

// Member is one bitcoin node of a network.
type Member struct {
	Name  string `json:"name"`
	IP    string `json:"ip,omitempty"`
	Ready bool   `json:"ready"`
}

// Backup is a VolumeBackup: where its copy goes and how far it is.
type Backup struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Store     string `json:"store"`
	Volume    string `json:"volume,omitempty"`
	Phase     string `json:"phase"`
	Node      string `json:"node,omitempty"`
	Size      string `json:"size,omitempty"`
	// Percent is bytes read of the size, -1 before the size is known.
	Percent    float64   `json:"percent"`
	Uploaded   string    `json:"uploaded,omitempty"`
	Throughput string    `json:"throughput,omitempty"`
	Message    string    `json:"message,omitempty"`
	Created    time.Time `json:"created"`
}

// watchedKinds are the kinds the snapshot reads besides the request kinds.
func watchedKinds() []client.Object {
	return []client.Object{
		&corev1.Node{}, &storagev1alpha1.CStorPool{}, &storagev1alpha1.CStorVolumeReplica{},
		&corev1.PersistentVolumeClaim{}, &corev1.Pod{}, &corev1.Event{},
		&scmv1alpha1.PullRequest{}, &scmv1alpha1.Branch{},
	}
}

// build reads the snapshot from r (the console's cache).
func build(ctx context.Context, r client.Reader, t *tracker, now time.Time) (*Snapshot, error) {
	s := &Snapshot{Time: now, Omitted: map[string]int{}}
	list := func(l client.ObjectList) error {
		// Read-only: the cache's objects need no copy.
		if err := r.List(ctx, l, client.UnsafeDisableDeepCopy); err != nil {
			return fmt.Errorf("console: listing %T: %w", l, err)
		}
		return nil
	}
	var (
		nodes    corev1.NodeList
		pools    storagev1alpha1.CStorPoolList
		replicas storagev1alpha1.CStorVolumeReplicaList
		volumes  storagev1alpha1.CStorVolumeList
		pvcs     corev1.PersistentVolumeClaimList
		pods     corev1.PodList
		events   corev1.EventList
		prs      scmv1alpha1.PullRequestList
		branches scmv1alpha1.BranchList
		networks bitcoinv1alpha1.BitcoinNetworkList
		backups  storagev1alpha1.VolumeBackupList
	)
	for _, l := range []client.ObjectList{&nodes, &pools, &replicas, &volumes, &pvcs, &pods, &events, &prs, &branches, &networks, &backups} {
		if err := list(l); err != nil {
			return nil, err
		}
	}
	s.Nodes = buildNodes(s, nodes.Items, pools.Items, replicas.Items)
	s.Volumes = buildVolumes(s, volumes.Items, pvcs.Items, pods.Items)
	s.InFlight = buildInFlight(s, t)
	s.Completed = t.recent()
	s.Deliveries = buildDeliveries(s, events.Items)
	s.PullRequests, s.Branches = buildSCM(s, prs.Items, branches.Items)
	s.Networks = buildNetworks(s, networks.Items)
	s.Backups = buildBackups(s, backups.Items)
	return s, nil
}

// capped keeps the first n of items and counts the rest in s.Omitted[what].
func capped[T any](s *Snapshot, what string, items []T, n int) []T {
	if len(items) <= n {
		return items
	}
	s.Omitted[what] += len(items) - n
	return items[:n]
}

func buildNodes(s *Snapshot, nodes []corev1.Node, pools []storagev1alpha1.CStorPool, replicas []storagev1alpha1.CStorVolumeReplica) []Node {
	byNode := map[string]*Node{}
	var out []*Node
	node := func(name string) *Node {
		if n, ok := byNode[name]; ok {
			return n
		}
		n := &Node{Name: name, Gone: true, Pools: []Pool{}}
		byNode[name] = n
		out = append(out, n)
		return n
	}
	for i := range nodes {
		n := node(nodes[i].Name)
		n.Gone = false
		n.Simulated = simnode.IsSimulated(&nodes[i])
		for _, c := range nodes[i].Status.Conditions {
			if c.Type == corev1.NodeReady {
				n.Ready = c.Status == corev1.ConditionTrue
			}
		}
	}
	type poolRef struct{ node, name string }
	poolIndex := map[poolRef]int{}
	pool := func(nodeName, name string) *Pool {
		n := node(nodeName)
		if i, ok := poolIndex[poolRef{nodeName, name}]; ok {
			return &n.Pools[i]
		}
		poolIndex[poolRef{nodeName, name}] = len(n.Pools)
		n.Pools = append(n.Pools, Pool{Name: name, Replicas: []Replica{}})
		return &n.Pools[len(n.Pools)-1]
	}
	for i := range pools {
		p := &pools[i]
		pp := pool(p.Spec.NodeName, p.Name)
		pp.Claim, pp.Phase, pp.Total = p.Spec.Claim, string(p.Status.Phase), p.Spec.Capacity.String()
		if c := p.Status.Capacity; c != nil {
			pp.Total, pp.Used = bytesIEC(c.Total), bytesIEC(c.Used)
		}
	}
	for i := range replicas {
		r := &replicas[i]
		// A replica whose pool is gone is shown under the pool's name, phase unknown.
		pp := pool(r.Spec.NodeName, r.Spec.Pool)
		rep := Replica{Namespace: r.Namespace, Name: r.Name, Volume: r.Spec.Volume, Phase: string(r.Status.Phase)}
		if c := r.Status.Capacity; c != nil {
			rep.Used = bytesIEC(c.Used)
		}
		if b := r.Status.Rebuild; b != nil {
			rb := &Rebuild{Source: b.Source, Percent: -1, Progress: b.Progress, Error: b.Error}
			if b.TotalBytes > 0 {
				rb.Percent = float64(b.DoneBytes) * 100 / float64(b.TotalBytes)
			}
			rep.Rebuild = rb
		}
		pp.Replicas = append(pp.Replicas, rep)
	}
	slices.SortFunc(out, func(a, b *Node) int { return cmp.Compare(a.Name, b.Name) })
	res := make([]Node, 0, len(out))
	for _, n := range out {
		slices.SortFunc(n.Pools, func(a, b Pool) int { return cmp.Compare(a.Name, b.Name) })
		n.Pools = capped(s, "pools", n.Pools, maxPools)
		for j := range n.Pools {
			p := &n.Pools[j]
			slices.SortFunc(p.Replicas, func(a, b Replica) int {
				return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
			})
			p.Replicas = capped(s, "replicas", p.Replicas, maxReplicas)
		}
		res = append(res, *n)
	}
	return capped(s, "nodes", res, maxNodes)
}

func buildVolumes(s *Snapshot, volumes []storagev1alpha1.CStorVolume, pvcs []corev1.PersistentVolumeClaim, pods []corev1.Pod) []Volume {
	// The CSI driver names a volume after its PV, pvc-<claim uid> (the provisioner's PV
	// name), which is also the claim's spec.volumeName once bound.
	claimOf := map[string]string{}
	for i := range pvcs {
		c := &pvcs[i]
		key := c.Namespace + "/" + c.Name
		claimOf["pvc-"+string(c.UID)] = key
		if c.Spec.VolumeName != "" {
			claimOf[c.Spec.VolumeName] = key
		}
	}
	users := map[string][]VolumeUser{}
	for i := range pods {
		p := &pods[i]
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			key := p.Namespace + "/" + v.PersistentVolumeClaim.ClaimName
			users[key] = append(users[key], VolumeUser{Pod: p.Namespace + "/" + p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase)})
		}
	}
	out := make([]Volume, 0, len(volumes))
	for i := range volumes {
		v := &volumes[i]
		vol := Volume{
			Namespace: v.Namespace, Name: v.Name, Phase: string(v.Status.Phase),
			Ready: v.Status.ReadyReplicas, Desired: v.Status.DesiredReplicas, Capacity: v.Spec.Capacity.String(),
		}
		if vol.Desired == 0 {
			vol.Desired = v.Spec.EffectiveReplicationFactor()
		}
		if c := meta.FindStatusCondition(v.Status.Conditions, conditions.TypeReady); c != nil {
			vol.Message = c.Message
		}
		if s := v.Annotations[driver.AnnotationPublished]; s != "" {
			m := map[string]string{}
			if json.Unmarshal([]byte(s), &m) == nil {
				for n := range m {
					vol.Published = append(vol.Published, n)
				}
				slices.Sort(vol.Published)
			}
		}
		if claim, ok := claimOf[v.Name]; ok {
			vol.Claim = claim
			u := users[claim]
			slices.SortFunc(u, func(a, b VolumeUser) int { return cmp.Compare(a.Pod, b.Pod) })
			vol.Users = capped(s, "volume users", u, maxUsers)
		}
		out = append(out, vol)
	}
	slices.SortFunc(out, func(a, b Volume) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return capped(s, "volumes", out, maxVolumes)
}

// buildInFlight lists the requests in flight, as the tracker follows them from the
// informers' events.
func buildInFlight(s *Snapshot, t *tracker) []Request {
	out, total := t.oldestInFlight(maxInFlight)
	if total > len(out) {
		s.Omitted["requests in flight"] += total - len(out)
	}
	return out
}

func buildDeliveries(s *Snapshot, events []corev1.Event) []Delivery {
	out := make([]Delivery, 0, len(events))
	for i := range events {
		e := &events[i]
		at := e.EventTime.Time
		if at.IsZero() {
			at = cmp.Or(e.LastTimestamp, e.FirstTimestamp, e.CreationTimestamp).Time
		}
		out = append(out, Delivery{
			Time: at, Delivery: e.Annotations[webhook.DeliveryAnnotation], Reason: e.Reason,
			Kind: e.InvolvedObject.Kind, Object: e.InvolvedObject.Name, Message: e.Message,
		})
	}
	slices.SortFunc(out, func(a, b Delivery) int { return cmp.Or(b.Time.Compare(a.Time), cmp.Compare(a.Delivery, b.Delivery)) })
	return capped(s, "webhook deliveries", out, maxDeliveries)
}

func buildSCM(s *Snapshot, prs []scmv1alpha1.PullRequest, branches []scmv1alpha1.Branch) ([]PullRequest, []Branch) {
	// Most recently changed first: that is what the latest delivery touched.
	slices.SortFunc(prs, func(a, b scmv1alpha1.PullRequest) int {
		return cmp.Or(updated(b.Spec.UpdatedAt, b.ObjectMeta).Compare(updated(a.Spec.UpdatedAt, a.ObjectMeta)), cmp.Compare(a.Name, b.Name))
	})
	slices.SortFunc(branches, func(a, b scmv1alpha1.Branch) int {
		return cmp.Or(updated(b.Spec.UpdatedAt, b.ObjectMeta).Compare(updated(a.Spec.UpdatedAt, a.ObjectMeta)), cmp.Compare(a.Name, b.Name))
	})
	outPR := make([]PullRequest, 0, min(len(prs), maxSCM))
	for _, p := range capped(s, "pull requests", prs, maxSCM) {
		outPR = append(outPR, PullRequest{Name: p.Name, Repository: p.Spec.Repository, Number: p.Spec.Number, User: p.Spec.User, State: string(p.Spec.Status), Merged: p.Spec.Merged})
	}
	outBr := make([]Branch, 0, min(len(branches), maxSCM))
	for _, b := range capped(s, "branches", branches, maxSCM) {
		outBr = append(outBr, Branch{Name: b.Name, Repository: b.Spec.Repository, Branch: b.Spec.Name, State: string(b.Spec.State)})
	}
	return outPR, outBr
}

func updated(at *metav1.Time, m metav1.ObjectMeta) time.Time {
	if at != nil {
		return at.Time
	}
	return m.CreationTimestamp.Time
}

func buildNetworks(s *Snapshot, networks []bitcoinv1alpha1.BitcoinNetwork) []Network {
	out := make([]Network, 0, len(networks))
	for i := range networks {
		n := &networks[i]
		net := Network{
			Namespace: n.Namespace, Name: n.Name, Nodes: n.Spec.Nodes,
			ReadyNodes: n.Status.ReadyNodes, Peers: n.Status.Peers,
		}
		if c := meta.FindStatusCondition(n.Status.Conditions, conditions.TypeReady); c != nil {
			net.Ready = c.Status == metav1.ConditionTrue && n.Status.ObservedGeneration >= n.Generation
			net.Reason, net.Message = c.Reason, c.Message
		}
		for _, m := range n.Status.Nodes {
			net.Members = append(net.Members, Member{Name: m.Name, IP: m.IP, Ready: m.Ready})
		}
		out = append(out, net)
	}
	slices.SortFunc(out, func(a, b Network) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return capped(s, "bitcoin networks", out, maxNetworks)
}

// buildBackups lists the backups, newest first.
func buildBackups(s *Snapshot, backups []storagev1alpha1.VolumeBackup) []Backup {
	out := make([]Backup, 0, len(backups))
	for i := range backups {
		b := &backups[i]
		st := b.Status
		bk := Backup{
			Namespace: b.Namespace, Name: b.Name, Store: b.Spec.Store, Volume: st.Volume,
			Phase: string(st.Phase), Node: st.Node, Throughput: st.Throughput, Percent: -1,
			Created: b.CreationTimestamp.Time,
		}
		if bk.Phase == "" {
			bk.Phase = string(storagev1alpha1.BackupPending)
		}
		if st.Size != nil {
			bk.Size = bytesIEC(*st.Size)
			if n := st.Size.Value(); n > 0 {
				bk.Percent = math.Round(float64(st.BytesDone)*1000/float64(n)) / 10
			}
		}
		if st.BytesUploaded > 0 {
			bk.Uploaded = bytesIEC(*resource.NewQuantity(st.BytesUploaded, resource.BinarySI))
		}
		if c := meta.FindStatusCondition(b.Status.Conditions, conditions.TypeReady); c != nil {
			bk.Message = c.Message
		}
		out = append(out, bk)
	}
	slices.SortFunc(out, func(a, b Backup) int {
		return cmp.Or(b.Created.Compare(a.Created), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return capped(s, "backups", out, maxBackups)
}

// bytesIEC formats a byte quantity as people read it: 1.5 GiB, 12 MiB, 512 B.
func bytesIEC(q resource.Quantity) string {
	b := float64(q.Value())
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	if i == 0 || b >= 100 {
		return fmt.Sprintf("%.0f %s", b, units[i])
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}
