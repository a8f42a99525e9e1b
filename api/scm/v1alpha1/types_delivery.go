package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DeliveryResult is what the webhook listener did with a delivery.
// +kubebuilder:validation:Enum=created;updated;unchanged;stale;duplicate
type DeliveryResult string

const (
	DeliveryCreated   DeliveryResult = "created"   // the object was created
	DeliveryUpdated   DeliveryResult = "updated"   // the object was changed
	DeliveryUnchanged DeliveryResult = "unchanged" // the object already said this
	DeliveryStale     DeliveryResult = "stale"     // the object held newer state; only the Event was written
	// DeliveryDuplicate: the delivery's Event already existed when this record was written: an
	// earlier attempt, or a concurrent copy of the body, stored it.
	DeliveryDuplicate DeliveryResult = "duplicate"
)

// DeliverySpec is what the listener received. It never changes: a record is the listener's
// memory of one signed body, checked before anything is written for it again.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a delivery record is immutable"
type DeliverySpec struct {
	// deliveryID is the X-GitHub-Delivery the body was first received under.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	DeliveryID string `json:"deliveryID"`

	// event is the X-GitHub-Event the body was first received as. The header is not signed:
	// the same body under another event is a replay.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	Event string `json:"event"`

	// receivedAt is when the listener first received the body; the record is deleted once it
	// is older than the listener's retention (--delivery-retention).
	// +required
	ReceivedAt metav1.Time `json:"receivedAt"`
}

// DeliveryStatus is what the listener stored for the delivery. The listener writes it with the
// record, in one create, once the object and its Event are stored: a record is never pending.
// (Earlier listeners created the record first and completed its status last; a record such
// a listener left pending, its status empty, is completed by the next delivery of its body.)
// Once complete it never changes.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.result) || self == oldSelf",message="a complete delivery record is immutable"
type DeliveryStatus struct {
	// result is what the delivery did to its object.
	// +optional
	Result DeliveryResult `json:"result,omitempty"`

	// object is <resource>/<name> of the PullRequest or Branch the delivery is recorded on.
	// +optional
	// +kubebuilder:validation:MaxLength=300
	Object string `json:"object,omitempty"`

	// eventName is the core/v1 Event recording the delivery (deleted by the API server after
	// its event TTL; this record outlives it).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	EventName string `json:"eventName,omitempty"`

	// completedAt is when the object and the Event were found stored and the record written.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`
}

// Delivery records one GitHub webhook body the listener accepted, named sha256-<hex digest of
// the raw body>, in the listener's namespace. It is how the listener knows a delivery days
// later, after the core/v1 Event about it is gone: a redelivery, or a captured body replayed
// under another delivery ID or event, changes nothing.
//
// It has no status subresource: like a core/v1 Event it is a write-once log entry, created
// complete (spec and status) in one write, the last of its delivery; a status subresource would
// drop the status of that create and cost a second write.
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=deliveries,singular=delivery,scope=Namespaced,shortName=dlv,categories={crdipc,crdipc-scm}
// +kubebuilder:selectablefield:JSONPath=`.spec.deliveryID`
// +kubebuilder:printcolumn:name="Event",type=string,JSONPath=`.spec.event`
// +kubebuilder:printcolumn:name="Delivery",type=string,JSONPath=`.spec.deliveryID`
// +kubebuilder:printcolumn:name="Result",type=string,JSONPath=`.status.result`
// +kubebuilder:printcolumn:name="Object",type=string,JSONPath=`.status.object`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Delivery struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec DeliverySpec `json:"spec"`
	// +optional
	Status DeliveryStatus `json:"status,omitempty"`
}

// DeliveryList is a list of Deliveries.
// +kubebuilder:object:root=true
type DeliveryList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Delivery `json:"items"`
}
