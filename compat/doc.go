// Package compat will be the single switch between the upstream, legacy and
// drainer read modes (compat.Dial(url, mode), compat.ModeFromEnv).
//
// Status: not implemented yet; it needs the drainer and legacy modes. Until
// then, code that calls amqp.Dial runs upstream's reader, byte for byte.
package compat
