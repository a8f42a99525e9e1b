package podsim

import (
	"context"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// The resolver alone, on the fake client: envFrom, then env in order with $(VAR) expansion,
// each kind of valueFrom, and optional references to what does not exist.
func TestContainerEnv(t *testing.T) {
	optional := true
	fc := fake.NewClientBuilder().WithObjects(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"K": "from-cm"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}, Data: map[string][]byte{"K": []byte("from-secret")}},
	).Build()
	er := envResolver{as: func(string) (client.Client, error) { return fc, nil }}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
		Spec:       corev1.PodSpec{NodeName: "n1"},
	}
	c := &corev1.Container{
		Name: "c",
		EnvFrom: []corev1.EnvFromSource{
			{Prefix: "CM_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}},
			{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "missing"}, Optional: &optional}},
		},
		Env: []corev1.EnvVar{
			{Name: "A", Value: "a"},
			{Name: "B", Value: "$(A)-$(CM_K)-$(LATER)-$$(A)"},
			{Name: "LATER", Value: "later"},
			{Name: "IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "K"}}},
			{Name: "OPT", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "absent", Optional: &optional}}},
		},
	}
	got, err := er.containerEnv(context.Background(), pod, c, "127.2.0.1", &corev1.Node{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"CM_K": "from-cm", "A": "a", "B": "a-from-cm-$(LATER)-$(A)", "LATER": "later",
		"IP": "127.2.0.1", "NODE": "n1", "S": "from-secret",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("containerEnv = %v, want %v", got, want)
	}

	command, args := expandCommand(&corev1.Container{Command: []string{"run", "$(A)"}, Args: []string{"$(UNDEFINED)", "$$(A)"}}, got)
	if !reflect.DeepEqual(command, []string{"run", "a"}) || !reflect.DeepEqual(args, []string{"$(UNDEFINED)", "$(A)"}) {
		t.Errorf("expandCommand = %q %q", command, args)
	}

	c.Env = append(c.Env, corev1.EnvVar{Name: "REQ", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "absent"}}})
	if _, err := er.containerEnv(context.Background(), pod, c, "127.2.0.1", &corev1.Node{}); err == nil || !strings.Contains(err.Error(), "couldn't find key absent") {
		t.Errorf("a required key that does not exist: %v, want an error naming it", err)
	}
}
