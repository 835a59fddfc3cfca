// Command oauth2-refresh keeps one connection alive on an OAuth 2 token that
// expires: its provider re-reads a token file that the platform keeps fresh
// (a Kubernetes projected service-account token, a Vault agent's sink, a
// sidecar of the identity provider) and reads the token's expiry from its
// exp claim. The connection asks the provider again at 80% of the token's
// life and installs the new token with update-secret (docs/oauth2.md); it
// publishes a message a second and prints the refresh counters.
//
//	AMQP_URL=amqp://rabbit.example:5672/ TOKEN_FILE=/var/run/secrets/rabbitmq/token \
//	  AMQP091_READ_MODE=drainer go run ./examples/oauth2-refresh
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/amqp091-drainer/amqp091-drainer/compat"
)

func main() {
	url, file := os.Getenv("AMQP_URL"), os.Getenv("TOKEN_FILE")
	if url == "" || file == "" {
		log.Fatal("set AMQP_URL (no user info) and TOKEN_FILE (the path of the token to read)")
	}
	mode, err := compat.ModeFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	cfg := amqp.Config{
		Credentials:  tokenFile(file),
		SafeRecovery: true, // the opt-in of default mode; drainer and legacy refresh anyway
	}
	conn, err := compat.DialConfig(url, cfg, mode)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := publishEverySecond(ctx, conn); err != nil && !errors.Is(err, context.Canceled) {
		log.Fatal(err)
	}
}

// tokenFile is a Config.Credentials that reads the token at path, and its
// expiry from the token's exp claim. The signature is the broker's to
// check: the client only needs to know when to ask again.
func tokenFile(path string) amqp.CredentialsFunc {
	return func(context.Context) (amqp.Authentication, error) {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		token := strings.TrimSpace(string(raw))
		claims := jwt.MapClaims{}
		if _, _, err := jwt.NewParser().ParseUnverified(token, claims); err != nil {
			return nil, fmt.Errorf("%s holds no JWT: %w", path, err) // never the token itself
		}
		exp, err := claims.GetExpirationTime()
		if err != nil || exp == nil {
			return nil, fmt.Errorf("the token in %s has no exp claim", path)
		}
		return amqp.ExpiringAuth{Authentication: &amqp.PlainAuth{Password: token}, Expires: exp.Time}, nil
	}
}

// publishEverySecond publishes to the default exchange until ctx ends, and
// prints the connection's refresh counters with each publish.
func publishEverySecond(ctx context.Context, conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return err
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if err := ch.PublishWithContext(ctx, "", q.Name, false, false,
			amqp.Publishing{Body: []byte("tick")}); err != nil {
			return err
		}
		s := conn.Stats().Credentials
		fmt.Printf("%s: %d refreshes, %d failed, the token expires in %v\n", conn.ReadMode(),
			s.Refreshes, s.Failures, time.Until(s.Expires).Round(time.Second))
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
