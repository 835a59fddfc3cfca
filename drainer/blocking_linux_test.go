package drainer

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"testing"
	"time"
)

// The blocking socket against a local TCP peer, no broker: its deadlines, its Close
// ending calls blocked in the kernel, writev, TLS over it, and where it steps aside.

// pair dials a listener through BlockingDialer and returns both ends, closed at the end.
func pair(t *testing.T) (client net.Conn, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = BlockingDialer(nil, time.Minute)("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer = <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = client.Close(); _ = peer.Close() })
	if _, ok := client.(*blockingConn); !ok {
		t.Fatalf("BlockingDialer returned a %T, want a *blockingConn", client)
	}
	return client, peer
}

func TestBlockingConnReadsAndWrites(t *testing.T) {
	client, peer := pair(t)
	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v", buf, err)
	}
	// writev: empty buffers skipped, more buffers than one writev takes, all consumed.
	var v net.Buffers
	var want []byte
	for i := range 3000 {
		b := []byte{byte(i), byte(i >> 8)}
		if i%7 == 0 {
			b = nil
		}
		v = append(v, b)
		want = append(want, b...)
	}
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(want))
		_, _ = io.ReadFull(peer, b)
		got <- b
	}()
	n, err := client.(*blockingConn).WriteBuffers(&v)
	if err != nil || n != int64(len(want)) || len(v) != 0 {
		t.Fatalf("WriteBuffers = %d, %v, %d buffers left; want %d, nil, 0", n, err, len(v), len(want))
	}
	if !bytes.Equal(<-got, want) {
		t.Fatal("the peer read other bytes than were written")
	}
	if client.LocalAddr().String() != peer.RemoteAddr().String() {
		t.Fatalf("LocalAddr %v, the peer sees %v", client.LocalAddr(), peer.RemoteAddr())
	}
	_ = peer.Close()
	if _, err := client.Read(buf); err != io.EOF {
		t.Fatalf("read after the peer closed: %v, want io.EOF", err)
	}
}

func TestBlockingConnDeadlines(t *testing.T) {
	client, peer := pair(t)
	buf := make([]byte, 8)
	_ = client.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	_, err := client.Read(buf)
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past its deadline: %v, want a timeout", err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond || waited > 5*time.Second {
		t.Fatalf("the read ended after %v, its deadline was 50ms", waited)
	}
	// A deadline in the past fails at once; a cleared one waits for the bytes.
	_ = client.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := client.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with a past deadline: %v", err)
	}
	_ = client.SetReadDeadline(time.Time{})
	go func() { _, _ = peer.Write([]byte("x")) }()
	if n, err := client.Read(buf); n != 1 || err != nil {
		t.Fatalf("read with no deadline: %d, %v", n, err)
	}
	// A write deadline bounds a write that the peer does not read.
	_ = client.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := client.Write(make([]byte, 64<<20)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write to a peer that does not read: %v, want the deadline", err)
	}
}

// TestBlockingConnCloseEndsBlockedCalls: Close wakes a read and a write blocked in the
// kernel (shutdown(2)), which then report net.ErrClosed, and later calls fail the same.
func TestBlockingConnCloseEndsBlockedCalls(t *testing.T) {
	client, _ := pair(t)
	errs := make(chan error, 2)
	go func() {
		_, err := client.Read(make([]byte, 8))
		errs <- err
	}()
	go func() {
		_, err := client.Write(make([]byte, 64<<20)) // more than the socket buffers hold
		errs <- err
	}()
	// Close wakes them wherever they are: blocked already, or about to call.
	if err := client.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("a call ended by Close: %v, want net.ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call blocked in the kernel outlived Close")
		}
	}
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: %v", err)
	}
	if err := client.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
}

// TestBlockingConnStepsAside: a socket that is not a *net.TCPConn, or one past
// MaxBlockingConns, is returned as it came, for the poller to read.
func TestBlockingConnStepsAside(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got, err := BlockingConn(a, time.Second); got != a || err != nil {
		t.Fatalf("BlockingConn(net.Pipe) = %T, %v; want the pipe itself", got, err)
	}
	blockingConns.Add(MaxBlockingConns)
	defer blockingConns.Add(-MaxBlockingConns)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conn, err := BlockingDialer(nil, time.Second)("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, ok := conn.(*net.TCPConn); !ok {
		t.Fatalf("past the cap: a %T, want the *net.TCPConn", conn)
	}
}

// TestBlockingConnUnderTLS: crypto/tls runs over the blocking socket, as DialConfig
// wraps it for amqps, and a TLS read's deadline is a temporary error that leaves the
// connection usable.
func TestBlockingConnUnderTLS(t *testing.T) {
	client, peer := pair(t)
	cert := selfSigned(t)
	server := tls.Server(peer, &tls.Config{Certificates: []tls.Certificate{cert}})
	go func() {
		if err := server.Handshake(); err == nil {
			_, _ = io.Copy(server, server) // echo
		}
	}()
	pool := x509.NewCertPool()
	pool.AddCert(cert.Leaf)
	tc := tls.Client(client, &tls.Config{RootCAs: pool, ServerName: "localhost"})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("TLS handshake over the blocking socket: %v", err)
	}
	buf := make([]byte, 4)
	_ = tc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := tc.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("TLS read past its deadline: %v", err)
	}
	_ = tc.SetReadDeadline(time.Time{})
	if _, err := tc.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(tc, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo over TLS after a timeout: %q, %v", buf, err)
	}
	_ = tc.Close()
}

// selfSigned makes a certificate for localhost.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}
