package backup

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Options locate a bucket and say how to reach it.
type S3Options struct {
	// Endpoint is host:port of the S3 service (no scheme).
	Endpoint string
	// Bucket holds the store's objects, under Prefix ("" or ending in "/" once cleaned).
	Bucket, Prefix string
	// AccessKey and SecretKey sign the requests (AWS signature V4).
	AccessKey, SecretKey string
	// Region of the bucket; "" lets the client ask.
	Region string
	// Insecure: plain HTTP. Otherwise HTTPS, trusting CA (PEM) if given, else the
	// system's roots.
	Insecure bool
	CA       []byte
	// SkipVerify accepts any server certificate (tests only).
	SkipVerify bool
	// CreateBucket makes the bucket if it does not exist.
	CreateBucket bool
}

type s3Store struct {
	c      *minio.Client
	bucket string
	prefix string
	name   string
}

// NewS3 returns the Store of a bucket (and prefix) of an S3-compatible service.
func NewS3(ctx context.Context, o S3Options) (Store, error) {
	if o.Endpoint == "" || o.Bucket == "" {
		return nil, errors.New("an S3 endpoint and a bucket are required")
	}
	if strings.Contains(o.Endpoint, "://") {
		return nil, fmt.Errorf("S3 endpoint %q: give host:port, without a scheme", o.Endpoint)
	}
	prefix := strings.Trim(o.Prefix, "/")
	if prefix != "" {
		prefix += "/"
	}
	opts := &minio.Options{
		Creds:  credentials.NewStaticV4(o.AccessKey, o.SecretKey, ""),
		Secure: !o.Insecure,
		Region: o.Region,
	}
	if !o.Insecure && (len(o.CA) > 0 || o.SkipVerify) {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.SkipVerify}
		if len(o.CA) > 0 {
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(o.CA) {
				return nil, errors.New("the S3 CA bundle holds no PEM certificate")
			}
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = cfg
		opts.Transport = tr
	}
	c, err := minio.New(o.Endpoint, opts)
	if err != nil {
		return nil, fmt.Errorf("S3 client for %s: %w", o.Endpoint, err)
	}
	s := &s3Store{c: c, bucket: o.Bucket, prefix: prefix, name: fmt.Sprintf("s3://%s/%s/%s", o.Endpoint, o.Bucket, prefix)}
	ok, err := c.BucketExists(ctx, o.Bucket)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s, err)
	}
	if !ok {
		if !o.CreateBucket {
			return nil, fmt.Errorf("%s: the bucket does not exist", s)
		}
		if err := c.MakeBucket(ctx, o.Bucket, minio.MakeBucketOptions{Region: o.Region}); err != nil {
			return nil, fmt.Errorf("%s: creating the bucket: %w", s, err)
		}
	}
	return s, nil
}

func (s *s3Store) String() string { return s.name }

func (s *s3Store) Put(ctx context.Context, key string, data []byte) error {
	return s.put(ctx, "put", key, data, minio.PutObjectOptions{})
}

func (s *s3Store) Create(ctx context.Context, key string, data []byte) error {
	var opts minio.PutObjectOptions
	opts.SetMatchETagExcept("*")
	err := s.put(ctx, "create", key, data, opts)
	if minio.ToErrorResponse(errors.Unwrap(err)).Code == "PreconditionFailed" {
		return fmt.Errorf("create %s: %w", key, ErrExists)
	}
	return err
}

// put writes an object in one request (objects here are a chunk at most: no multipart).
func (s *s3Store) put(ctx context.Context, op, key string, data []byte, opts minio.PutObjectOptions) error {
	opts.ContentType, opts.DisableMultipart = "application/octet-stream", true
	if _, err := s.c.PutObject(ctx, s.bucket, s.prefix+key, bytes.NewReader(data), int64(len(data)), opts); err != nil {
		return fmt.Errorf("%s %s: %w", op, key, err)
	}
	return nil
}

func (s *s3Store) Get(ctx context.Context, key string) ([]byte, error) {
	obj, err := s.c.GetObject(ctx, s.bucket, s.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s.err("get", key, err)
	}
	defer obj.Close()
	data, err := io.ReadAll(obj)
	if err != nil {
		return nil, s.err("get", key, err)
	}
	return data, nil
}

func (s *s3Store) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	info, err := s.c.StatObject(ctx, s.bucket, s.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return ObjectInfo{}, s.err("stat", key, err)
	}
	return ObjectInfo{Key: key, Size: info.Size, Modified: info.LastModified}, nil
}

func (s *s3Store) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing when fn fails
	for info := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if info.Err != nil {
			return fmt.Errorf("list %s: %w", prefix, info.Err)
		}
		if err := fn(ObjectInfo{Key: strings.TrimPrefix(info.Key, s.prefix), Size: info.Size, Modified: info.LastModified}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (s *s3Store) Delete(ctx context.Context, key string) error {
	if err := s.c.RemoveObject(ctx, s.bucket, s.prefix+key, minio.RemoveObjectOptions{}); err != nil {
		return s.err("delete", key, err)
	}
	return nil
}

// err maps S3's "no such key" to ErrNotFound.
func (s *s3Store) err(op, key string, err error) error {
	if code := minio.ToErrorResponse(err).Code; code == minio.NoSuchKey || code == "NotFound" {
		return fmt.Errorf("%s %s: %w", op, key, ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}
