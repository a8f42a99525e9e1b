// Package registration registers the CSI node plugin with the kubelet, the job upstream's
// csi-node-driver-registrar does in a sidecar container.
//
// The kubelet learns of node plugins through its plugin-registration API
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1): it watches a directory, by default
// /var/lib/kubelet/plugins_registry, for Unix sockets; on each new socket it calls the
// Registration service's GetInfo, checks the answer (plugin type, name, supported CSI
// versions), registers the plugin and reports the outcome with NotifyRegistrationStatus. From
// then on it calls the driver's Node service at the endpoint GetInfo named. When the socket
// goes away the kubelet deregisters the plugin.
//
// A Server serves that service on <dir>/<driver name>-reg.sock as a manager.Runnable: it
// waits until the driver's own CSI socket answers, removes a socket file a crashed run left
// behind, serves, and removes its socket when it stops. The endpoint it reports is the CSI
// socket's path on the host, where the kubelet dials it, which need not be the path the
// driver's container sees.
//
// A refusal (PluginRegistered false) is logged and makes Check fail, and with it the
// driver's /healthz when wrapped with Healthz: the kubelet's liveness probe restarts the
// container, which offers itself again, as node-driver-registrar does by exiting. Check fails
// too when the registration socket is removed under the running server (the kubelet would
// not find the driver again until a restart recreates it).
package registration
