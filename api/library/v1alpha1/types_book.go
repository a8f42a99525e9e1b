package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BookSpec is the request: a book to be catalogued.
type BookSpec struct {
	// title of the book.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Title string `json:"title"`

	// author of the book.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Author string `json:"author"`

	// isbn is an ISBN-10 (the last character may be X) or an ISBN-13 starting with 978 or 979,
	// with optional single hyphens between digits. The schema checks the shape; the Book
	// controller checks the checksum and reports Ready=False/InvalidSpec when it is wrong.
	// +optional
	// +kubebuilder:validation:MaxLength=17
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]-?){9}[0-9Xx]$') || self.matches('^97[89]-?([0-9]-?){9}[0-9]$')",message="isbn must be an ISBN-10 or ISBN-13: 10 or 13 digits (an ISBN-10 may end in X), optionally separated by single hyphens"
	ISBN string `json:"isbn,omitempty"`

	// ttlSecondsAfterFinished, when set, lets the controller delete the Book this many seconds
	// after it became Ready, so finished requests do not pile up in etcd.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
}

// BookStatus is the reply to the request.
type BookStatus struct {
	// observedGeneration is the metadata.generation the status was computed for; a sender
	// must not trust the conditions while it is behind metadata.generation.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready is True when the book is catalogued.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// Book is a request to catalogue a book (seed 002). The Book controller replies in status.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=books,singular=book,scope=Namespaced,shortName=bk,categories={crdipc,crdipc-library}
// +kubebuilder:printcolumn:name="Title",type=string,JSONPath=`.spec.title`
// +kubebuilder:printcolumn:name="Author",type=string,JSONPath=`.spec.author`
// +kubebuilder:printcolumn:name="ISBN",type=string,JSONPath=`.spec.isbn`,priority=1
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Book struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec BookSpec `json:"spec"`
	// +optional
	Status BookStatus `json:"status,omitempty"`
}

// BookList is a list of Books.
// +kubebuilder:object:root=true
type BookList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Book `json:"items"`
}

// GetConditions implements conditions.Object.
func (b *Book) GetConditions() []metav1.Condition { return b.Status.Conditions }

// SetConditions implements conditions.Object.
func (b *Book) SetConditions(c []metav1.Condition) { b.Status.Conditions = c }

// GetObservedGeneration implements conditions.Object.
func (b *Book) GetObservedGeneration() int64 { return b.Status.ObservedGeneration }

// SetObservedGeneration implements conditions.Object.
func (b *Book) SetObservedGeneration(g int64) { b.Status.ObservedGeneration = g }
