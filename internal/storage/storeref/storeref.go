// Package storeref opens the backup repository a BackupStore names: it reads the S3
// credentials and the encryption key from their Secrets in the backup namespace and opens
// the store in the bucket (package backup). The operator and the pool agents share it, so
// that both read a store's object the same way.
package storeref

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/backup"
)

// ErrSecret is wrapped by Open when a Secret or one of its keys that the store names is
// missing: the store's spec, or the Secrets, are to be fixed.
var ErrSecret = errors.New("secret")

// Open returns the repository of store, reading its Secrets with r. With create, an empty
// prefix is made into a new store; without, a prefix holding no store is backup.ErrNoStore.
// A wrong key is backup.ErrWrongKey; a store that cannot be reached wraps the client's error.
func Open(ctx context.Context, r client.Reader, store *storagev1alpha1.BackupStore, create bool) (*backup.Repository, error) {
	s := store.Spec
	access, err := secretValue(ctx, r, s.AccessKeyID)
	if err != nil {
		return nil, err
	}
	secret, err := secretValue(ctx, r, s.SecretAccessKey)
	if err != nil {
		return nil, err
	}
	key, err := secretValue(ctx, r, s.EncryptionKey)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(strings.TrimSuffix(s.Endpoint, "/"))
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("endpoint %q: want http(s)://host[:port]", s.Endpoint)
	}
	o := backup.S3Options{
		Endpoint: u.Host, Bucket: s.Bucket, Prefix: s.Prefix, Region: s.Region,
		AccessKey: string(access), SecretKey: string(secret),
		Insecure: u.Scheme == "http",
	}
	if t := s.TLS; t != nil {
		o.CA, o.SkipVerify = t.CABundle, t.InsecureSkipVerify
	}
	st, err := backup.NewS3(ctx, o)
	if err != nil {
		return nil, err
	}
	if create {
		o := backup.InitOptions{ChunkSize: storagev1alpha1.DefaultBackupChunkSize}
		if s.ChunkSize != nil {
			o.ChunkSize = int(s.ChunkSize.Value())
		}
		return backup.Open(ctx, st, key, o)
	}
	return backup.OpenExisting(ctx, st, key)
}

// secretValue reads one key of a Secret in the backup namespace. The value is never part of
// an error: errors end up in status, Events and logs.
func secretValue(ctx context.Context, r client.Reader, ref storagev1alpha1.SecretKeyRef) ([]byte, error) {
	var sec corev1.Secret
	err := r.Get(ctx, client.ObjectKey{Namespace: storagev1alpha1.BackupNamespace, Name: ref.Name}, &sec)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w %s/%s not found", ErrSecret, storagev1alpha1.BackupNamespace, ref.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading secret %s/%s: %w", storagev1alpha1.BackupNamespace, ref.Name, err)
	}
	v, ok := sec.Data[ref.Key]
	if !ok || len(v) == 0 {
		return nil, fmt.Errorf("%w %s/%s has no key %q", ErrSecret, storagev1alpha1.BackupNamespace, ref.Name, ref.Key)
	}
	return v, nil
}

// Labels of a crdipc backup's manifest: the VolumeBackup it was made for. A cluster that finds
// the backup in the store (discovery) makes a VolumeBackup of that name in that namespace.
const (
	ManifestNamespace = "crdipc.io/namespace"
	ManifestName      = "crdipc.io/name"
)
