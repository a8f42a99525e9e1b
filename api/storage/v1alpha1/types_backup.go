package v1alpha1

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BackupNamespace holds the Secrets of backup stores: the S3 credentials and the encryption
// keys. The node agents that upload backups read Secrets there and nowhere else, so the
// data-path CA key in the system namespace stays out of their reach.
const BackupNamespace = "crdipc-backup"

// LabelBackupNode names the node whose pool agent uploads a VolumeBackup: one that holds a
// copy of its snapshot, next to the data it reads.
const LabelBackupNode = "storage.crdipc.io/backup-node"

// DefaultBackupChunkSize is the chunk size of a store a BackupStore makes when its spec names
// none: 1 MiB. Measured on a 256 MiB ext4 volume, a backup after 1 % of it changed uploads
// 1.2 % of the volume at 1 MiB and 3.1 % at 4 MiB (two chunks of the change, and the file
// system's metadata, each uploaded whole).
const DefaultBackupChunkSize = 1 << 20

// SecretKeyRef names one key of a Secret in BackupNamespace.
type SecretKeyRef struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// key in its data.
	// +required
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
}

// BackupStoreTLS configures how an https endpoint is trusted.
type BackupStoreTLS struct {
	// caBundle is the PEM of the certificate authorities to trust instead of the system's.
	// +optional
	CABundle []byte `json:"caBundle,omitempty"`
	// insecureSkipVerify accepts any server certificate. For tests only.
	// +optional
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
}

// BackupRetention says which backups of a volume a store keeps; the rest are deleted and
// their chunks pruned. Unset fields keep everything.
type BackupRetention struct {
	// keepLast keeps the newest N completed backups of each volume.
	// +optional
	// +kubebuilder:validation:Minimum=1
	KeepLast *int32 `json:"keepLast,omitempty"`
}

// BackupStoreSpec is an S3 bucket (and prefix) that holds backups, encrypted with a key.
type BackupStoreSpec struct {
	// endpoint is the S3 server's URL: https://host[:port], or http:// for a server on a
	// trusted network (credentials and encrypted chunks then cross it in the clear).
	// +required
	// +kubebuilder:validation:Pattern=`^https?://[^/?#]+/?$`
	Endpoint string `json:"endpoint"`
	// bucket holds the store; it must exist.
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	Bucket string `json:"bucket"`
	// prefix is where in the bucket the store lives, so that one bucket can hold several.
	// +optional
	// +kubebuilder:validation:Pattern=`^([a-zA-Z0-9._-]+/)*$`
	Prefix string `json:"prefix,omitempty"`
	// region of the bucket, for servers that need one.
	// +optional
	Region string `json:"region,omitempty"`
	// accessKeyID and secretAccessKey are keys of the Secret in crdipc-backup that holds
	// the S3 credentials.
	// +required
	AccessKeyID SecretKeyRef `json:"accessKeyID"`
	// +required
	SecretAccessKey SecretKeyRef `json:"secretAccessKey"`
	// encryptionKey is the key, of at least 32 bytes, that every chunk and manifest is
	// encrypted with. A store made with one key opens with that key only: keep a copy of it
	// outside the cluster, since a restore needs the bucket and this key, nothing else.
	// +required
	EncryptionKey SecretKeyRef `json:"encryptionKey"`
	// tls configures an https endpoint.
	// +optional
	TLS *BackupStoreTLS `json:"tls,omitempty"`
	// retention says which backups are kept.
	// +optional
	Retention *BackupRetention `json:"retention,omitempty"`
	// chunkSize is the size of the pieces a volume is cut into, for a store made in an empty
	// prefix (an existing store keeps its own, status.chunkSize): a multiple of 4Ki from
	// 64Ki to 64Mi, default 1Mi (DefaultBackupChunkSize). Each changed chunk is uploaded
	// whole, so smaller chunks make incremental backups smaller, and cost more objects:
	// 1024 per GiB written at 1Mi, 256 at 4Mi.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('64Ki')) || quantity(string(self)).compareTo(quantity('64Ki')) == 0",message="chunkSize must be at least 64Ki"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isLessThan(quantity('64Mi')) || quantity(string(self)).compareTo(quantity('64Mi')) == 0",message="chunkSize must be at most 64Mi"
	ChunkSize *resource.Quantity `json:"chunkSize,omitempty"`
	// allowedNamespaces are the namespaces, besides the one a backup was made in, that may
	// restore any backup of this store: a VolumeBackup there may name it (annotation
	// storage.crdipc.io/backup-id) and a claim there may be filled from it. "*" is every
	// namespace. Empty: a backup is restored only in its own namespace, and one that records
	// none (not made through a VolumeBackup) nowhere. A namespace allowed here reads other
	// namespaces' backups, but never deletes them from the store.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:Pattern=`^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$`
	// +kubebuilder:validation:items:MaxLength=63
	AllowedNamespaces []string `json:"allowedNamespaces,omitempty"`
}

// MayRestore says whether a VolumeBackup or a claim in namespace may restore a backup of the
// store made in origin ("" for a backup that records no namespace).
func (s *BackupStore) MayRestore(origin, namespace string) bool {
	if origin != "" && origin == namespace {
		return true
	}
	return slices.Contains(s.Spec.AllowedNamespaces, namespace) || slices.Contains(s.Spec.AllowedNamespaces, "*")
}

// BackupStoreStatus is the operator's view of the store.
type BackupStoreStatus struct {
	// observedGeneration is the metadata.generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// chunkSize of the store, in bytes (fixed when the store was made).
	// +optional
	ChunkSize int64 `json:"chunkSize,omitempty"`
	// backups is how many completed backups the bucket holds.
	// +optional
	Backups int32 `json:"backups,omitempty"`
	// lastChecked is when the store was last opened.
	// +optional
	LastChecked *metav1.Time `json:"lastChecked,omitempty"`
	// conditions: Ready is True once the bucket is reachable and opens with the key.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// BackupStore is a place outside the cluster where VolumeBackups go: an S3 bucket, with the
// key that encrypts them. The operator opens it (making it, in an empty prefix) and lists
// the backups it holds: a new cluster given the same bucket and key finds them all.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=backupstores,singular=backupstore,scope=Cluster,shortName=bstore,categories={crdipc,crdipc-storage}
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.spec.endpoint`
// +kubebuilder:printcolumn:name="Bucket",type=string,JSONPath=`.spec.bucket`
// +kubebuilder:printcolumn:name="Prefix",type=string,JSONPath=`.spec.prefix`,priority=1
// +kubebuilder:printcolumn:name="Backups",type=integer,JSONPath=`.status.backups`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`,priority=1
type BackupStore struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec BackupStoreSpec `json:"spec"`
	// +optional
	Status BackupStoreStatus `json:"status,omitempty"`
}

// BackupStoreList is a list of BackupStores.
// +kubebuilder:object:root=true
type BackupStoreList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BackupStore `json:"items"`
}

// GetConditions implements conditions.Object.
func (o *BackupStore) GetConditions() []metav1.Condition { return o.Status.Conditions }

// SetConditions implements conditions.Object.
func (o *BackupStore) SetConditions(c []metav1.Condition) { o.Status.Conditions = c }

// GetObservedGeneration implements conditions.Object.
func (o *BackupStore) GetObservedGeneration() int64 { return o.Status.ObservedGeneration }

// SetObservedGeneration implements conditions.Object.
func (o *BackupStore) SetObservedGeneration(g int64) { o.Status.ObservedGeneration = g }

// BackupSource is what a VolumeBackup copies: a PVC, through a VolumeSnapshot the backup
// takes of it (so the copy is crash-consistent), or an existing VolumeSnapshot.
// +kubebuilder:validation:XValidation:rule="has(self.persistentVolumeClaimName) != has(self.volumeSnapshotName)",message="exactly one of persistentVolumeClaimName and volumeSnapshotName is required"
type BackupSource struct {
	// persistentVolumeClaimName is a PVC of a crdipc StorageClass in the backup's namespace.
	// +optional
	// +kubebuilder:validation:MinLength=1
	PersistentVolumeClaimName string `json:"persistentVolumeClaimName,omitempty"`
	// volumeSnapshotName is a VolumeSnapshot of a crdipc volume in the backup's namespace.
	// +optional
	// +kubebuilder:validation:MinLength=1
	VolumeSnapshotName string `json:"volumeSnapshotName,omitempty"`
}

// BackupDeletionPolicy says what deleting a VolumeBackup does to the backup in its store.
// +kubebuilder:validation:Enum=Retain;Delete
type BackupDeletionPolicy string

const (
	// BackupRetain leaves the backup in the store: the object is a view of it, and the
	// store's next sync finds it again. The default, so that deleting objects by mistake
	// (or with the cluster) loses no backup.
	BackupRetain BackupDeletionPolicy = "Retain"
	// BackupDelete deletes the backup from the store; its chunks go at the next prune.
	BackupDelete BackupDeletionPolicy = "Delete"
)

// VolumeBackupSpec asks for a copy of a volume in a BackupStore.
// +kubebuilder:validation:XValidation:rule="has(self.source) == has(oldSelf.source)",message="source is immutable"
type VolumeBackupSpec struct {
	// store is the BackupStore to copy into.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="store is immutable"
	Store string `json:"store"`
	// source is what is copied. A backup that was found in the store (made by another
	// cluster, or before this one was rebuilt) has none.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="source is immutable"
	Source *BackupSource `json:"source,omitempty"`
	// deletionPolicy says whether deleting this object deletes the backup from the store.
	// +optional
	// +kubebuilder:default=Retain
	DeletionPolicy BackupDeletionPolicy `json:"deletionPolicy,omitempty"`
}

// AnnotationBackupID, on a VolumeBackup that was found in its store rather than made here,
// names the backup in the store.
const AnnotationBackupID = "storage.crdipc.io/backup-id"

// BackupPhase is where a VolumeBackup is.
// +kubebuilder:validation:Enum=Pending;Snapshotting;Uploading;Completed;Failed
type BackupPhase string

// Backup phases.
const (
	BackupPending      BackupPhase = "Pending"
	BackupSnapshotting BackupPhase = "Snapshotting"
	BackupUploading    BackupPhase = "Uploading"
	BackupCompleted    BackupPhase = "Completed"
	BackupFailed       BackupPhase = "Failed"
)

// VolumeBackupStatus is the backup's progress, reported by the operator until the copy is
// taken and by the uploading node's agent after that.
type VolumeBackupStatus struct {
	// observedGeneration is the metadata.generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// phase is where the backup is.
	// +optional
	Phase BackupPhase `json:"phase,omitempty"`
	// backupID names the backup in the store: the VolumeBackup's UID.
	// +optional
	BackupID string `json:"backupID,omitempty"`
	// originNamespace is the namespace the backup was made in: this one for a backup made
	// here, what the manifest records for one found in the store ("" if it records none).
	// A backup of another namespace is restored here only if the store allows it
	// (BackupStore spec.allowedNamespaces).
	// +optional
	OriginNamespace string `json:"originNamespace,omitempty"`
	// volumeSnapshot is the VolumeSnapshot it reads (taken by the backup, or its source).
	// +optional
	VolumeSnapshot string `json:"volumeSnapshot,omitempty"`
	// snapshot is the CStorVolumeSnapshot (in crdipc-system) behind it.
	// +optional
	Snapshot string `json:"snapshot,omitempty"`
	// volume is what was backed up, namespace/claim.
	// +optional
	Volume string `json:"volume,omitempty"`
	// node uploads it, from the snapshot copy it holds.
	// +optional
	Node string `json:"node,omitempty"`
	// size of the volume, and bytesDone of it read so far.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`
	// +optional
	BytesDone int64 `json:"bytesDone,omitempty"`
	// bytesUploaded and objectsUploaded count what was written to the store (encrypted,
	// compressed): chunks the store had already are not uploaded again.
	// +optional
	BytesUploaded int64 `json:"bytesUploaded,omitempty"`
	// +optional
	ObjectsUploaded int64 `json:"objectsUploaded,omitempty"`
	// throughput is bytes of the volume read per second, e.g. "212Mi/s".
	// +optional
	Throughput string `json:"throughput,omitempty"`
	// startTime and completionTime bound the upload.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// uploadError is the uploading agent's last failure, retried with backoff.
	// +optional
	UploadError string `json:"uploadError,omitempty"`
	// conditions: Ready is True once Completed; False with a reason while pending or failed.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// VolumeBackup is a request for a copy of a volume in a BackupStore, encrypted on the node
// that reads it. It is answered in its status: phase, bytes done, bytes and objects uploaded.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=volumebackups,singular=volumebackup,scope=Namespaced,shortName=vbak,categories={crdipc,crdipc-storage}
// +kubebuilder:printcolumn:name="Store",type=string,JSONPath=`.spec.store`
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.status.volume`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Uploaded",type=integer,JSONPath=`.status.bytesUploaded`
// +kubebuilder:printcolumn:name="Throughput",type=string,JSONPath=`.status.throughput`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.node`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`
type VolumeBackup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec VolumeBackupSpec `json:"spec"`
	// +optional
	Status VolumeBackupStatus `json:"status,omitempty"`
}

// VolumeBackupList is a list of VolumeBackups.
// +kubebuilder:object:root=true
type VolumeBackupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VolumeBackup `json:"items"`
}

// GetConditions implements conditions.Object.
func (o *VolumeBackup) GetConditions() []metav1.Condition { return o.Status.Conditions }

// SetConditions implements conditions.Object.
func (o *VolumeBackup) SetConditions(c []metav1.Condition) { o.Status.Conditions = c }

// GetObservedGeneration implements conditions.Object.
func (o *VolumeBackup) GetObservedGeneration() int64 { return o.Status.ObservedGeneration }

// SetObservedGeneration implements conditions.Object.
func (o *VolumeBackup) SetObservedGeneration(g int64) { o.Status.ObservedGeneration = g }
