package oauthnode

import (
	"crypto/rand"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Permission is what a scope grants on the resources it names.
type Permission string

// The three permissions of RabbitMQ's access control.
const (
	Configure Permission = "configure"
	Write     Permission = "write"
	Read      Permission = "read"
)

// Scope returns the scope granting perm on the resources whose names match
// name in the vhosts matching vhost: patterns in which * stands for any
// run of characters, and anything else for itself (escaped here as the
// broker wants it: vhost "/" is %2F). Scope(Read, "*", "*") is
// "rabbitmq.read:*/*".
//
// A scope of this form grants nothing on a topic exchange's routing keys,
// which RabbitMQ checks apart: see [TopicScope].
func Scope(perm Permission, vhost, name string) string {
	return ResourceServerID + "." + string(perm) + ":" + pattern(vhost) + "/" + pattern(name)
}

// TopicScope is [Scope] that also grants perm on the routing keys matching
// routingKey of the topic exchanges it names: a publish to a topic
// exchange needs write on it, a queue.bind to one read.
func TopicScope(perm Permission, vhost, exchange, routingKey string) string {
	return Scope(perm, vhost, exchange) + "/" + pattern(routingKey)
}

// pattern escapes what lies between the wildcards of p. The broker
// URL-decodes those parts ('+' included, as a space), never the '*'.
func pattern(p string) string {
	parts := strings.Split(p, "*")
	for i, s := range parts {
		parts[i] = url.QueryEscape(s)
	}
	return strings.Join(parts, "*")
}

// FullAccess grants every permission on every resource of every vhost,
// topic routing keys included: what [Node.Token] grants when given no
// scopes.
func FullAccess() []string {
	return []string{
		Scope(Configure, "*", "*"),
		TopicScope(Write, "*", "*", "*"),
		TopicScope(Read, "*", "*", "*"),
	}
}

// WriteOnly grants what [FullAccess] grants, but write only on the
// resources (exchanges and queues, in every vhost) whose names match
// pattern: a token narrowed at a refresh, so that publishing to any other
// exchange (and binding any other queue) is refused. Scopes only ever
// grant, so "everything but X" is a pattern X does not match.
func WriteOnly(pattern string) []string {
	return []string{
		Scope(Configure, "*", "*"),
		TopicScope(Write, "*", pattern, "*"),
		TopicScope(Read, "*", "*", "*"),
	}
}

// NoWrite grants configure and read on everything and write on nothing:
// declaring, consuming and basic.get work, every publish is refused.
func NoWrite() []string {
	return []string{
		Scope(Configure, "*", "*"),
		TopicScope(Read, "*", "*", "*"),
	}
}

// Token mints a token the node accepts until expires: HS256 with the
// node's key (kid [KeyID]), audience [ResourceServerID], subject
// [Subject], and scopes (none: [FullAccess]). The broker reads exp in
// whole seconds and counts a token expired from that second on, so
// expires is now+ttl rounded up to a second. A ttl ≤ 0 mints a token that
// has already expired.
func (n *Node) Token(ttl time.Duration, scopes ...string) (token string, expires time.Time, err error) {
	return sign(n.key, ttl, scopes)
}

// ForeignToken is [Node.Token] signed with a key the node does not know,
// under the node's key ID: a well-formed token the broker must refuse for
// its signature alone.
func (n *Node) ForeignToken(ttl time.Duration, scopes ...string) (token string, expires time.Time, err error) {
	key := make([]byte, len(n.key))
	if _, err := rand.Read(key); err != nil {
		return "", time.Time{}, err
	}
	return sign(key, ttl, scopes)
}

// sign mints a token of the node's shape with key.
func sign(key []byte, ttl time.Duration, scopes []string) (string, time.Time, error) {
	if len(scopes) == 0 {
		scopes = FullAccess()
	}
	now := time.Now()
	exp := now.Add(ttl + time.Second - 1).Truncate(time.Second)
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"iss": "oauthnode",
		"sub": Subject,
		"aud": []string{ResourceServerID},
		// The space-separated form of RFC 8693 and of most providers; the
		// plugin takes a list as well.
		"scope": strings.Join(scopes, " "),
		"iat":   now.Unix(),
		"exp":   exp.Unix(),
	})
	tok.Header["kid"] = KeyID
	s, err := tok.SignedString(key)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("oauthnode: sign: %w", err)
	}
	return s, exp, nil
}
