package backup

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// MinKeySize is the shortest store key accepted: the key is used as it is (HKDF), not
// stretched as a passphrase would need to be, so it must be random bytes of its own.
const MinKeySize = 32

// keys are what a store's key derives, with the store's salt: one key names chunks, the
// other encrypts chunks and manifests. A key never leaves the process that derived it.
type keys struct {
	id   []byte
	aead cipher.AEAD
}

func deriveKeys(master, salt []byte) (*keys, error) {
	if len(master) < MinKeySize {
		return nil, fmt.Errorf("the encryption key is %d bytes; at least %d random bytes are needed", len(master), MinKeySize)
	}
	id, err := hkdf.Key(sha256.New, master, salt, "crdipc backup chunk names", 32)
	if err != nil {
		return nil, err
	}
	enc, err := hkdf.Key(sha256.New, master, salt, "crdipc backup encryption", 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(enc)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &keys{id: id, aead: aead}, nil
}

// name is the chunk name of plain: its keyed hash, in hex.
func (k *keys) name(plain []byte) string {
	m := hmac.New(sha256.New, k.id)
	m.Write(plain)
	return hex.EncodeToString(m.Sum(nil))
}

// seal encrypts plain bound to label (a chunk's name, a manifest's key) into buf, or a
// new buffer if buf cannot hold the nonce: a random nonce, then the ciphertext and its
// tag. plain may lie at buf[NonceSize:], and is then sealed in place, or elsewhere.
func (k *keys) seal(buf, plain []byte, label string) []byte {
	n := k.aead.NonceSize()
	if cap(buf) < n {
		buf = make([]byte, n, n+len(plain)+k.aead.Overhead())
	}
	nonce := buf[:n]
	if _, err := rand.Read(nonce); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return k.aead.Seal(nonce, nonce, plain, []byte(label))
}

// errOpen: the ciphertext does not decrypt under this key for this label.
var errOpen = errors.New("does not decrypt with the store's key (a wrong key, or the object was altered)")

func (k *keys) open(sealed []byte, label string) ([]byte, error) {
	n := k.aead.NonceSize()
	if len(sealed) < n+k.aead.Overhead() {
		return nil, errOpen
	}
	plain, err := k.aead.Open(nil, sealed[:n], sealed[n:], []byte(label))
	if err != nil {
		return nil, errOpen
	}
	return plain, nil
}
