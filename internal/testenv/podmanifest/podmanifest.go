package podmanifest

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MountPath is where a Pod's Claim is mounted.
const MountPath = "/data"

// Pod is a pod that runs Command once (restartPolicy Never).
type Pod struct {
	Name string
	// Namespace is "default" when empty.
	Namespace string
	// Node binds the pod to a node (spec.nodeName), past the scheduler; Hostname has the
	// scheduler put it there (a kubernetes.io/hostname node selector). Neither: anywhere.
	Node, Hostname string
	// Image runs Command; PullPolicy is its imagePullPolicy ("": Kubernetes' default).
	// Real nodes have only the images the harness imported: they need PullNever.
	Image      string
	PullPolicy corev1.PullPolicy
	Command    []string
	// Claim, when set, is a PersistentVolumeClaim mounted at MountPath.
	Claim string
}

// PullNever says a node must use the image it has.
const PullNever = corev1.PullNever

// Shell is a Pod that runs script with sh -c in image.
func Shell(name, image, script string) Pod {
	return Pod{Name: name, Image: image, Command: []string{"sh", "-c", script}}
}

// Manifest is the pod as kubectl apply -f takes it (JSON, which is YAML too).
func (p Pod) Manifest() string {
	ns := p.Namespace
	if ns == "" {
		ns = "default"
	}
	// A test deletes its pods and waits for them to go: the script has nothing to save.
	grace := int64(1)
	pod := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      p.Node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "main", Image: p.Image, ImagePullPolicy: p.PullPolicy, Command: p.Command,
			}},
		},
	}
	if p.Hostname != "" {
		pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: p.Hostname}
	}
	if p.Claim != "" {
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: MountPath}}
		pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: p.Claim},
		}}}
	}
	b, err := json.Marshal(pod)
	if err != nil {
		panic(err) // a corev1.Pod always marshals
	}
	return string(b)
}
