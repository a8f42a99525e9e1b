package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
)

// MaxGeneratedNameLength caps the names the operator derives from other names. 63 keeps them
// usable as label values and, with a suffix, as file names on any node file system.
const MaxGeneratedNameLength = 63

// PoolName is the name of the CStorPool of claim on node. It is a function of the two names
// only, so two operators racing to create the pool create the same object and one of them
// gets AlreadyExists — never two pools for one node (an OpenEBS bug with generated names).
// The operator finds a claim's pools by spec (claim, nodeName), not by this name, so pools
// named by an earlier scheme ("<claim>-<node>") are kept and no second one is made.
func PoolName(claim, node string) string { return joinName(claim, node) }

// ReplicaName is the name of the CStorVolumeReplica of volume on pool, deterministic for the
// same reason as PoolName; replicas, too, are found by spec (volume, pool) and owner.
func ReplicaName(volume, pool string) string { return joinName(volume, pool) }

// nameHashLength is how many hex digits of a hash of its parts a derived name carries.
const nameHashLength = 10

// joinName joins parts with "-", cut to fit, and appends a hash of the parts. The hash tells
// apart parts that read alike once joined ("a-b"+"c" and "a"+"b-c" are both "a-b-c"), so
// distinct parts never share a name, however long. Dots become dashes: the result is a DNS
// label of at most MaxGeneratedNameLength characters.
func joinName(parts ...string) string {
	// "/" is in no object name, so the hashed string tells the parts apart.
	sum := sha256.Sum256([]byte(strings.Join(parts, "/")))
	hash := hex.EncodeToString(sum[:])[:nameHashLength]
	// A DNS label may neither start nor end with '-'.
	readable := strings.TrimLeft(strings.ReplaceAll(strings.Join(parts, "-"), ".", "-"), "-")
	readable = strings.TrimRight(readable[:min(len(readable), MaxGeneratedNameLength-len(hash)-1)], "-")
	if readable == "" {
		return hash
	}
	return readable + "-" + hash
}

// CSIDriverName is crdipc's CSI driver: the provisioner of its StorageClasses and the driver
// of its VolumeSnapshotClasses.
const CSIDriverName = "csi.crdipc.io"

// CSIParamBackup is the CreateVolume parameter, "<store>/<backup id>", with which crdipc's
// provisioner asks the driver for a volume filled from a backup: a claim whose dataSourceRef
// is a VolumeBackup. CSI has no content source for a backup.
const CSIParamBackup = "csi.crdipc.io/backup"

// DataCASecret is the Secret, in the crdipc system namespace, holding the certificate
// authority of the storage data path (tls.crt, tls.key). Only the storage operator reads
// it: it signs the data-path certificates the node agents and CSI node services request
// (DataSigner), and every replica data connection is mutual TLS under it.
const DataCASecret = "crdipc-storage-data-ca"

// DataCAConfigMap is the ConfigMap, in the crdipc system namespace, publishing the data-path
// CA's certificate (key DataCAKey) and nothing else: what the data-path parts trust.
const DataCAConfigMap = "crdipc-storage-data-ca"

// DataCAKey is the key of the CA certificate (PEM) in DataCAConfigMap.
const DataCAKey = "ca.crt"

// AnnotationPublished, on a CStorVolume, records the nodes the volume is published to (CSI
// ControllerPublish), as a JSON object node → "rw" | "ro": where its target may run. The
// replica data services serve a volume's replicas to the CSI node services of those nodes.
const AnnotationPublished = "csi.crdipc.io/published"

// PublishedNodes returns the nodes AnnotationPublished names, node → "rw" | "ro".
func PublishedNodes(vol *CStorVolume) map[string]string {
	m := map[string]string{}
	if s := vol.Annotations[AnnotationPublished]; s != "" {
		_ = json.Unmarshal([]byte(s), &m)
	}
	return m
}

// DataSigner is the signerName of the CertificateSigningRequests for data-path identities;
// the storage operator approves (a node asking for its own identity) and signs them.
const DataSigner = "crdipc.io/storage-data"

// AgentFinalizer is the pool agent's finalizer on CStorPools and CStorVolumeReplicas: the
// object stays until the agent on its node has destroyed its data. The operator puts it on
// replicas at creation and releases it itself when the node is gone for good.
const AgentFinalizer = "storage.crdipc.io/pool-agent"

// NodeLeaseName is the name of node's Lease, in the crdipc system namespace, that fences the
// pool agents of one node: only its holder acts. The operator reads it to tell a node whose
// agent is gone from one whose agent is only slow.
func NodeLeaseName(node string) string {
	name := "pool-agent-" + node
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(node))
	return name[:240] + "-" + hex.EncodeToString(sum[:])[:12]
}

// ReplicaDataID is how the replica data service names a replica: namespace/name of its
// CStorVolumeReplica.
func ReplicaDataID(namespace, name string) string { return namespace + "/" + name }

// SnapshotDataID is the data service's id of the copy a replica holds of a snapshot: the
// replica's id, "@", and the snapshot's UID (the name its copies have on the nodes, so a
// snapshot deleted and made again under the same name never reads an old copy).
func SnapshotDataID(namespace, replica, snapshotUID string) string {
	return ReplicaDataID(namespace, replica) + "@" + snapshotUID
}
