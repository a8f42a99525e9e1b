// Package podsim is the kubelet of the simulated nodes of `crdipc up`: it runs their Pods
// as local processes, so that workloads such as the BitcoinNetwork operator's
// StatefulSets really run in one process on a laptop, against the real embedded API
// server.
//
// # What it simulates
//
// Scheduling is not its part: kube-scheduler, which the control plane of `crdipc up` runs,
// binds pods to nodes, simulated ones (Options.NodeLabel; by default simnode.Label,
// crdipc.io/simulated=true) among them, by their labels, taints and the capacity package
// simnode reports for them. podsim only runs the pods bound to simulated Nodes; pods bound
// to other nodes are their kubelets' business, and a pod kube-scheduler cannot place
// stays Pending with the PodScheduled=False condition kube-scheduler writes.
//
// Running. Every pod bound to a simulated Node gets a loopback IP of its own,
// 127.2.x.y (Linux routes all of 127.0.0.0/8 to lo, so each pod can listen on its own
// ports with no setup), kept for the pod's life and across restarts of up (it is read
// back from status.podIP), and a directory Root/<pod UID> that outlives container
// restarts and restarts of up. For each container the runtime resolves the environment
// as kubelet does (envFrom; env with $(VAR) expansion; valueFrom Secret and ConfigMap
// keys read from the API server, downward-API fields and resource fields), expands
// $(VAR) in command and args with kubelet's own expansion code, and asks the Image
// registered for the container's image repository for a process
// (Image.Command). The process runs in its own process group with stdout and stderr
// appended to Root/<pod UID>/<container>.log; Process.Forward adds TCP forwarders from
// podIP:port to wherever the process really listens. Init containers run one after the
// other to completion first; init containers with restartPolicy Always (sidecars) are
// started and kept running.
//
// Status. The runtime reports what kubelet reports, through the status subresource and
// only when it changes: phase, podIP(s), hostIP(s) (127.0.0.1), startTime, the
// conditions PodScheduled, PodReadyToStartContainers, Initialized, ContainersReady and
// Ready (readiness gates included), and container statuses with state, lastState,
// restartCount, ready, started, image, imageID ("podsim://<repository>") and containerID
// ("podsim://<pid>"). A container is ready once started, or, with a readinessProbe,
// when its tcpSocket or httpGet probe passes by kubelet's rules (delay, period, timeout,
// thresholds); exec and gRPC probes are not run: such a container counts as ready, and
// the Ready condition's message says so.
//
// Restarts. A process that exits is restarted by the pod's restartPolicy (Always;
// OnFailure when it failed; init containers on failure unless Never), after kubelet's
// back-off (10 s, doubling to 5 min, reset after 10 minutes of running; Options can
// shorten it), with lastState.terminated (exit code; 128+signal when signalled) and
// state waiting CrashLoopBackOff in between. A container whose image is not among
// Options.Images waits with reason ImageNotSimulated and a message naming the images
// up can run; the pod stays Pending. Missing Secrets or ConfigMaps give
// CreateContainerConfigError, an Image error RunContainerError; both are retried.
//
// Volumes. Before a pod's containers start, the runtime sets up its volumes as kubelet's
// volume manager does, and the containers wait in ContainerCreating until it has (the
// message says why: "waiting for PersistentVolumeClaim "data" to be bound", or the
// CSI error, with a FailedMount Event; retried, with back-off after failures). An
// emptyDir is Root/<pod UID>/volumes/kubernetes.io~empty-dir/<name>. A
// persistentVolumeClaim must be Bound to a CSI PersistentVolume of Options.CSIDriver;
// the runtime calls that node's CSI Node service (Options.CSI): NodeStageVolume once per
// node and volume at Root/nodes/<node>/plugins/kubernetes.io/csi/<driver>/<sha256 of
// the volume handle>/globalmount, with the capability kubelet derives from the PV
// (access mode, fsType, mountOptions) and its volume attributes, then NodePublishVolume
// at Root/<pod UID>/volumes/kubernetes.io~csi/<pv>/mount, read-only when the volume
// source or the PV says so. A container that mounts any of these runs in a mount
// namespace of its own (private propagation) in which each volumeMount is bind-mounted
// at its mountPath, honouring readOnly, subPath and subPathExpr; the node's file system
// is otherwise the same. Directories are not namespaced: a mountPath missing on the
// node, such as /data, is created there, empty, and removed (when still empty) once no
// container that mounts there runs. When the pod is done or deleted and its processes
// are gone, its volumes are unpublished, and unstaged when no other pod on that node
// uses them; a deleted pod's object goes only after that, as with kubelet. Stopping the
// runtime unpublishes and unstages every volume, so the volume targets close their
// replicas cleanly; the next start mounts them again. A pod's directory is never
// removed while something is mounted below it.
//
// Expansion. A claim whose controller-side expansion is done (allocatedResourceStatuses
// "storage": NodeResizePending, as the CSI sidecar's resizer leaves it) and that a pod
// here has mounted gets NodeExpandVolume on that pod's node, with the publish path and the
// staging path, as kubelet's volume manager does for online expansion; the claim's
// status.capacity then becomes the PV's capacity and the resize status and conditions go
// (a failure: condition NodeResizeError, Event FileSystemResizeFailed on the pod). A claim
// no pod mounts is expanded when one mounts it (resize.go).
//
// Deletion. A pod being deleted gets SIGTERM (to its process groups), SIGKILL when its
// grace period ends, and is then deleted for good (grace period 0, UID precondition), as
// kubelet's final delete. Its directory is removed once the pod object is gone; the
// directories of pods deleted while up was not running are removed when up starts.
//
// Restarts of up. Stopping the manager stops every process (SIGTERM, then SIGKILL after
// min(grace period, Options.StopTimeout)); pod objects are left as they are. A runtime
// that finds a pod on a simulated node it is not running (its processes ended with the
// previous up) starts it again: restartCount+1, lastState terminated with reason
// Unknown, the same IP when free, the same directory. Processes are started with
// Pdeathsig SIGKILL, so even an up that dies without stopping them takes them along.
//
// Nodes. A simulated Node that is deleted takes its pods with it, as
// kube-controller-manager's pod garbage collector does, but at once (up runs that
// collector too, which waits 40 s; the tests' control planes do not run it): their
// processes are stopped, their directories removed, and the pods marked Failed with a
// DisruptionTarget condition (reason DeletionByPodGC) and deleted, so that a
// StatefulSet recreates them on a node that exists. A Node that loses the simulated
// label is someone else's: its pods' processes are stopped and the pods left alone.
//
// # What it does not simulate
//
// No container images: an Image decides which local program runs (the busybox Image runs
// the host's /bin/sh and tools). No cgroups, resource limits, OOM kills, users or
// capabilities; no namespaces other than the mount namespace of a container with
// volumes, so no network isolation beyond distinct loopback IPs (a process can still
// reach every other pod and the host), no Services, DNS or service-link environment
// variables (and Endpoints never include loopback pod IPs). Volumes are emptyDirs and
// PVCs of CSI volumes only: projected service-account tokens, ConfigMap, Secret,
// hostPath and other volume types are ignored; block volumes (volumeDevices), inline
// CSI and generic ephemeral volumes are not run, and the runtime does not wait for a
// VolumeAttachment. Where the process may not create mount namespaces
// (no CAP_SYS_ADMIN), a container with only emptyDir mounts runs as if it had none, and
// one that mounts a PVC does not start (RunContainerError). No liveness or startup probes, lifecycle hooks, ephemeral containers,
// per-container restart rules, pod resize, or image changes of a running pod. No
// exec, attach, port-forward or logs API: read Root/<pod UID>/<container>.log instead.
// Resource requests and limits count only for kube-scheduler's fit against the node's
// reported capacity; nothing enforces them. hostNetwork pods get a loopback IP like every
// other pod.
//
// # Identity
//
// What the runtime writes about a node's pods (their status, their final deletion, their
// claims' status, their Events) and what it reads for them (Secrets, ConfigMaps, claims and
// their volumes) goes as that node's kubelet (Options.Kubelet; in `crdipc up`,
// system:node:<name>), so the Node authorizer and NodeRestriction admission hold each
// simulated node to its own pods as they hold a real kubelet. Watching the pods of every
// simulated node, and the claims it may have to expand, is one cache for all of them: it
// runs as the service's own read-only identity (crdipc-nodes, config/rbac/nodes), since a
// kubelet may watch only the pods of its one node:
// +kubebuilder:rbac:groups="",resources=pods;nodes;persistentvolumeclaims;persistentvolumes,verbs=get;list;watch
package podsim
