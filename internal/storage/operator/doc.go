// Package operator is the storage operator of seed 000 (Maya): it turns requests into work
// for the node agents, and the agents' reports into the requests' status, entirely through
// custom resources.
//
//   - StoragePoolClaim → one CStorPool per Ready node that matches the claim (up to
//     maxPools), named <claim>-<node> so that two operators racing can only ever create the
//     same pool. Deleting a claim deletes its empty pools; a pool holding replicas stays.
//   - CStorVolume → replicationFactor CStorVolumeReplicas named <volume>-<pool>, on distinct
//     healthy pools (distinct nodes first, then the least used), owned by the volume. With
//     fewer pools than replicas it places what fits, reports the volume Waiting ("2 of 3
//     replicas placed; waiting for 1 more pool") and places the rest when a pool appears:
//     pool changes are watched and re-run the volumes still missing replicas. Deleting a
//     volume deletes its replicas and waits (finalizer) until their agents have deleted
//     the data.
//
// Pools and replicas whose Node is gone and whose agent holds no Lease any more would keep
// their agent finalizer forever; the operator releases them when their claim or volume is
// deleted.
//
// Both are ipc receivers, so observedGeneration, the Ready/Progressing conditions, Events
// and metrics follow the crdipc status contract.
package operator
