package podsim

import (
	"context"
	"fmt"
	"os"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/kubernetes/pkg/api/v1/resource"
	"k8s.io/kubernetes/pkg/fieldpath"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// envResolver computes containers' environments. Its one dependency is where it reads the
// Secrets and ConfigMaps that env and envFrom refer to: the API server itself, not a cache,
// as the pod's node, which the Node authorizer lets get exactly what its pods reference.
type envResolver struct {
	as func(node string) (client.Client, error)
}

// containerEnv is a container's environment as kubelet computes it: envFrom first, then
// env in order, each value with $(VAR) expanded from the variables before it, each
// valueFrom resolved. Service links (KUBERNETES_SERVICE_HOST, …) are not added: no
// Service is reachable from a simulated pod.
func (er envResolver) containerEnv(ctx context.Context, pod *corev1.Pod, c *corev1.Container, ip string, node *corev1.Node) (map[string]string, error) {
	reader, err := er.as(pod.Spec.NodeName)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	secrets := map[string]*corev1.Secret{}
	configMaps := map[string]*corev1.ConfigMap{}
	secret := func(name string) (*corev1.Secret, error) {
		if s, ok := secrets[name]; ok {
			return s, nil
		}
		s := &corev1.Secret{}
		if err := reader.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, s); err != nil {
			return nil, err
		}
		secrets[name] = s
		return s, nil
	}
	configMap := func(name string) (*corev1.ConfigMap, error) {
		if cm, ok := configMaps[name]; ok {
			return cm, nil
		}
		cm := &corev1.ConfigMap{}
		if err := reader.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, cm); err != nil {
			return nil, err
		}
		configMaps[name] = cm
		return cm, nil
	}
	optional := func(o *bool) bool { return o != nil && *o }

	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := configMap(from.ConfigMapRef.Name)
			if apierrors.IsNotFound(err) && optional(from.ConfigMapRef.Optional) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("envFrom: %w", err)
			}
			for k, v := range cm.Data {
				env[from.Prefix+k] = v
			}
		case from.SecretRef != nil:
			s, err := secret(from.SecretRef.Name)
			if apierrors.IsNotFound(err) && optional(from.SecretRef.Optional) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("envFrom: %w", err)
			}
			for k, v := range s.Data {
				env[from.Prefix+k] = string(v)
			}
		}
	}

	mapping := expansion.MappingFuncFor(env)
	for _, e := range c.Env {
		value := e.Value
		switch {
		case value != "":
			value = expansion.Expand(value, mapping)
		case e.ValueFrom == nil:
		case e.ValueFrom.FieldRef != nil:
			v, err := fieldValue(pod, e.ValueFrom.FieldRef.FieldPath, ip)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			value = v
		case e.ValueFrom.ResourceFieldRef != nil:
			v, err := resource.ExtractResourceValueByContainerNameAndNodeAllocatable(e.ValueFrom.ResourceFieldRef, pod, c.Name, node.Status.Allocatable)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			value = v
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm, err := configMap(ref.Name)
			if apierrors.IsNotFound(err) && optional(ref.Optional) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			v, ok := cm.Data[ref.Key]
			if !ok {
				if optional(ref.Optional) {
					continue
				}
				return nil, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)
			}
			value = v
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s, err := secret(ref.Name)
			if apierrors.IsNotFound(err) && optional(ref.Optional) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			v, ok := s.Data[ref.Key]
			if !ok {
				if optional(ref.Optional) {
					continue
				}
				return nil, fmt.Errorf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)
			}
			value = string(v)
		default:
			return nil, fmt.Errorf("env %s: this kind of valueFrom is not supported by podsim", e.Name)
		}
		env[e.Name] = value
	}
	return env, nil
}

// fieldValue resolves a downward-API field reference.
func fieldValue(pod *corev1.Pod, path, ip string) (string, error) {
	switch path {
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return hostIP, nil
	case "status.podIP", "status.podIPs":
		return ip, nil
	}
	return fieldpath.ExtractFieldPathAsString(pod, path)
}

// expandCommand expands $(VAR) in command and args as kubelet does: references to
// undefined variables stay as they are, $$ escapes.
func expandCommand(c *corev1.Container, env map[string]string) (command, args []string) {
	mapping := expansion.MappingFuncFor(env)
	for _, s := range c.Command {
		command = append(command, expansion.Expand(s, mapping))
	}
	for _, s := range c.Args {
		args = append(args, expansion.Expand(s, mapping))
	}
	return command, args
}

// expandString expands $(VAR) in s as kubelet expands subPathExpr.
func expandString(s string, env map[string]string) string {
	return expansion.Expand(s, expansion.MappingFuncFor(env))
}

// processEnv is the environment of a process whose image left it to the runtime.
func processEnv(env map[string]string, pod *corev1.Pod, dir string) []string {
	all := map[string]string{"HOSTNAME": pod.Name, "HOME": dir, "PATH": os.Getenv("PATH")}
	if pod.Spec.Hostname != "" {
		all["HOSTNAME"] = pod.Spec.Hostname
	}
	for k, v := range env {
		all[k] = v
	}
	out := make([]string, 0, len(all))
	for k, v := range all {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
