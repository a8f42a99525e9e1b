package podmanifest

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestManifest(t *testing.T) {
	p := Shell("writer", "busybox", "echo hi > /data/x")
	p.Hostname, p.Claim, p.PullPolicy = "node-1", "data", PullNever
	var pod corev1.Pod
	if err := json.Unmarshal([]byte(p.Manifest()), &pod); err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	switch {
	case pod.Kind != "Pod" || pod.Namespace != "default" || pod.Name != "writer":
		t.Errorf("object %s %s/%s", pod.Kind, pod.Namespace, pod.Name)
	case pod.Spec.NodeSelector[corev1.LabelHostname] != "node-1" || pod.Spec.NodeName != "":
		t.Errorf("placement: selector %v, nodeName %q", pod.Spec.NodeSelector, pod.Spec.NodeName)
	case c.Image != "busybox" || c.ImagePullPolicy != corev1.PullNever || len(c.Command) != 3 || c.Command[2] != "echo hi > /data/x":
		t.Errorf("container %+v", c)
	case len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != MountPath || pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName != "data":
		t.Errorf("claim: mounts %v, volumes %v", c.VolumeMounts, pod.Spec.Volumes)
	case pod.Spec.RestartPolicy != corev1.RestartPolicyNever:
		t.Errorf("restartPolicy %s", pod.Spec.RestartPolicy)
	}
}
