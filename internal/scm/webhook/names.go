package webhook

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// maxNameLen keeps object names within a DNS-1123 label, so they also fit label values and
// leave room in the Event name <object>.<record> (a DNS-1123 subdomain, 253 characters).
const maxNameLen = 63

// hashLen is how many hex digits of SHA-256 a name suffix carries: 32 bits, enough to keep
// apart the few names of one repository that sanitize alike.
const hashLen = 8

// dnsLabel lowercases s and replaces every run of characters outside [a-z0-9] with one '-'.
// It reports whether anything other than case was lost.
func dnsLabel(s string) (string, bool) {
	lower := strings.ToLower(s)
	var b strings.Builder
	dash := false
	for _, r := range lower {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	out := strings.Trim(b.String(), "-")
	return out, out != lower
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:hashLen]
}

// withHash returns base truncated so that base-<hash of identity> fits maxNameLen.
func withHash(base, identity string) string {
	h := shortHash(identity)
	if max := maxNameLen - hashLen - 1; len(base) > max {
		base = strings.TrimRight(base[:max], "-")
	}
	if base == "" {
		return h
	}
	return base + "-" + h
}

// objectName builds <owner>-<repo>-<suffix> as a DNS-1123 label. GitHub repository names are
// case-insensitive, so lowercasing them loses nothing; the suffix (a branch name) is
// case-sensitive in git. A name that lost information or is too long gets a hash of identity
// appended, so two branches that sanitize alike ("feature/x", "feature-x", "Feature-X") never
// share an object.
func objectName(repository, suffix string, suffixCaseSensitive bool, identity string) string {
	repoPart, repoLossy := dnsLabel(strings.ReplaceAll(repository, "/", "-"))
	sufPart, sufLossy := dnsLabel(suffix)
	if suffixCaseSensitive && strings.ToLower(suffix) != suffix {
		sufLossy = true
	}
	name := repoPart + "-" + sufPart
	if repoPart == "" || sufPart == "" {
		name = strings.Trim(name, "-")
		sufLossy = true
	}
	if repoLossy || sufLossy || len(name) > maxNameLen {
		return withHash(name, identity)
	}
	return name
}

// collisionName is the name used when objectName is already taken by a different
// repository: "a-b/c" and "a/b-c" both map to "a-b-c-…". The hash of the identity makes it
// deterministic.
func collisionName(plain, identity string) string {
	return withHash(plain, "collision:"+identity)
}

// PullRequestName is the object name of a pull request: <owner>-<repo>-<number>, with a hash
// suffix when sanitizing lost information or the name would be too long.
func PullRequestName(repository string, number int64) string {
	id := pullRequestIdentity(repository, number)
	return objectName(repository, strconv.FormatInt(number, 10), false, id)
}

func pullRequestIdentity(repository string, number int64) string {
	return strings.ToLower(repository) + "#" + strconv.FormatInt(number, 10)
}

// BranchName is the object name of a branch: <owner>-<repo>-<branch>, with a hash suffix when
// sanitizing lost information (feature/x, Feature-X) or the name would be too long.
func BranchName(repository, branch string) string {
	return objectName(repository, branch, true, branchIdentity(repository, branch))
}

func branchIdentity(repository, branch string) string {
	return strings.ToLower(repository) + ":" + branch
}

// EventName is the name of the Event recording on an object the body whose Delivery record is
// named record (RecordName): <object>.sha256-<hex digest of the body>, at most 63+1+71
// characters. It is named after the body, not the X-GitHub-Delivery (which the Event carries in
// its scm.crdipc.io/delivery annotation), so that copies of one body under two delivery IDs
// (two hooks, or a replay) meet on one name before a second Event can be created.
func EventName(object, record string) string {
	return object + "." + record
}

// legacyEventName is the name earlier listeners gave the Event of a delivery,
// <object>.<X-GitHub-Delivery>: a record such a listener left pending may have its Event stored
// under it. IDs other than lowercase GUIDs are reduced to [a-z0-9-] with a hash.
func legacyEventName(object, delivery string) string {
	d, lossy := dnsLabel(delivery)
	if lossy || d == "" || len(d) > 128 {
		d = withHash(d, delivery)
	}
	return object + "." + d
}
