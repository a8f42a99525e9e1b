package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PullRequestState is GitHub's pull_request.state.
// +kubebuilder:validation:Enum=open;closed
type PullRequestState string

const (
	PullRequestOpen   PullRequestState = "open"
	PullRequestClosed PullRequestState = "closed"
)

// PullRequestSpec mirrors a GitHub pull request as last seen in a webhook delivery. The first
// four fields are those of seed 003; the rest make the object identify one pull request.
type PullRequestSpec struct {
	// user is the login of the pull request's author.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	User string `json:"user"`

	// branch is the head branch (pull_request.head.ref).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	Branch string `json:"branch"`

	// status is the pull request's state: open or closed (merged or not, see merged).
	// +required
	Status PullRequestState `json:"status"`

	// id is GitHub's global pull request id (pull_request.id).
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="id is immutable"
	ID int64 `json:"id"`

	// repository is the base repository as "owner/name".
	// +required
	// +kubebuilder:validation:MaxLength=140
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+$')",message="repository must be owner/name"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="repository is immutable"
	Repository string `json:"repository"`

	// number is the pull request's number within the repository.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="number is immutable"
	Number int64 `json:"number"`

	// headSha is the commit at the head of the pull request.
	// +optional
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9a-f]{40}$')",message="headSha must be a 40-character lowercase hex commit SHA"
	HeadSHA string `json:"headSha,omitempty"`

	// merged is true once the pull request was merged.
	// +optional
	Merged bool `json:"merged,omitempty"`

	// lastAction is the webhook action that last changed the object (opened, synchronize,
	// closed, ...). Free-form because GitHub adds actions over time.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	LastAction string `json:"lastAction,omitempty"`

	// updatedAt is pull_request.updated_at of the delivery that wrote this spec. Deliveries
	// arrive out of order; the listener ignores one older than this.
	// +optional
	UpdatedAt *metav1.Time `json:"updatedAt,omitempty"`
}

// PullRequestStatus follows the crdipc status contract.
type PullRequestStatus struct {
	// observedGeneration is the metadata.generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// PullRequest is a GitHub pull request written by the webhook listener (seed 003).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=pullrequests,singular=pullrequest,scope=Namespaced,shortName=pr,categories={crdipc,crdipc-scm}
// +kubebuilder:printcolumn:name="Repository",type=string,JSONPath=`.spec.repository`
// +kubebuilder:printcolumn:name="Number",type=integer,JSONPath=`.spec.number`
// +kubebuilder:printcolumn:name="User",type=string,JSONPath=`.spec.user`
// +kubebuilder:printcolumn:name="Branch",type=string,JSONPath=`.spec.branch`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.spec.status`
// +kubebuilder:printcolumn:name="Merged",type=boolean,JSONPath=`.spec.merged`
// +kubebuilder:printcolumn:name="Head",type=string,JSONPath=`.spec.headSha`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PullRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec PullRequestSpec `json:"spec"`
	// +optional
	Status PullRequestStatus `json:"status,omitempty"`
}

// PullRequestList is a list of PullRequests.
// +kubebuilder:object:root=true
type PullRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PullRequest `json:"items"`
}

// GetConditions implements conditions.Object.
func (o *PullRequest) GetConditions() []metav1.Condition { return o.Status.Conditions }

// SetConditions implements conditions.Object.
func (o *PullRequest) SetConditions(c []metav1.Condition) { o.Status.Conditions = c }

// GetObservedGeneration implements conditions.Object.
func (o *PullRequest) GetObservedGeneration() int64 { return o.Status.ObservedGeneration }

// SetObservedGeneration implements conditions.Object.
func (o *PullRequest) SetObservedGeneration(g int64) { o.Status.ObservedGeneration = g }
