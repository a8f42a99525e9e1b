// Package identity gives each crdipc service the identity it has on a cluster. Apply creates
// the ServiceAccounts, roles and bindings shipped in config/rbac; a Keeper then keeps, for
// each ServiceAccount, a short-lived token (TokenRequest API) fresh in a file and a kubeconfig
// that reads it, as the kubelet keeps a pod's projected token. `crdipc up` runs every
// service with such a config, so the shipped least-privilege roles are what runs there too,
// and the kubeconfigs let a service run as its own process under its own identity.
package identity
