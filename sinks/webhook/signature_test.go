package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/sinkconfig"
	"github.com/heraldhq/herald/sinks/sinktest"
)

// The example of the Standard Webhooks specification and its reference
// libraries.
const (
	specSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	specID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	specTimestamp = "1614265330"
	specBody      = `{"test": 2432232314}`
	specSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func specHeader(sig string) http.Header {
	h := http.Header{}
	h.Set(HeaderID, specID)
	h.Set(HeaderTimestamp, specTimestamp)
	h.Set(HeaderSignature, sig)
	return h
}

func TestSignatureMatchesSpecExample(t *testing.T) {
	t.Parallel()
	key, err := decodeSecret(specSecret)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(appendSignatures(nil, [][]byte{key}, specID, specTimestamp, []byte(specBody))); got != specSignature {
		t.Fatalf("signature = %q, want the specification's %q", got, specSignature)
	}
	if err := Verify(specSecret, specHeader(specSignature), []byte(specBody), 0); err != nil {
		t.Fatalf("Verify(spec example) = %v", err)
	}
}

func TestVerifyRejects(t *testing.T) {
	t.Parallel()
	now := strconv.FormatInt(time.Now().Unix(), 10)
	fresh := func(ts string) http.Header {
		h := specHeader("")
		h.Set(HeaderTimestamp, ts)
		key, _ := decodeSecret(specSecret)
		h.Set(HeaderSignature, string(appendSignatures(nil, [][]byte{key}, specID, ts, []byte(specBody))))
		return h
	}
	if err := Verify(specSecret, fresh(now), []byte(specBody), time.Minute); err != nil {
		t.Fatalf("fresh request: %v", err)
	}
	without := func(name string) http.Header { h := fresh(now); h.Del(name); return h }
	with := func(name, v string) http.Header { h := fresh(now); h.Set(name, v); return h }
	cases := []struct {
		name   string
		secret sinkconfig.Secret
		header http.Header
		want   error // nil: an error that is neither sentinel (bad secret)
		text   string
	}{
		{"no id", specSecret, without(HeaderID), ErrBadSignature, "missing"},
		{"no timestamp", specSecret, without(HeaderTimestamp), ErrBadSignature, "missing"},
		{"no signature", specSecret, without(HeaderSignature), ErrBadSignature, "missing"},
		{"timestamp not a number", specSecret, with(HeaderTimestamp, "yesterday"), ErrBadSignature, "not a unix time"},
		{"too old", specSecret, fresh(strconv.FormatInt(time.Now().Add(-10*time.Minute).Unix(), 10)), ErrStaleTimestamp, "tolerance"},
		{"too new", specSecret, fresh(strconv.FormatInt(time.Now().Add(10*time.Minute).Unix(), 10)), ErrStaleTimestamp, "tolerance"},
		{"other version only", specSecret, with(HeaderSignature, "v1a,"+strings.TrimPrefix(fresh(now).Get(HeaderSignature), "v1,")), ErrBadSignature, "no v1 signature"},
		{"not base64", specSecret, with(HeaderSignature, "v1,%%% nocomma"), ErrBadSignature, "no v1 signature"},
		{"bad secret", "whsec_%%", fresh(now), nil, "secret: the part after"},
	}
	for _, c := range cases {
		err := Verify(c.secret, c.header, []byte(specBody), 5*time.Minute)
		if err == nil || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%s: Verify = %v, want an error containing %q", c.name, err, c.text)
			continue
		}
		if c.want != nil && !errors.Is(err, c.want) || c.want == nil && (errors.Is(err, ErrBadSignature) || errors.Is(err, ErrStaleTimestamp)) {
			t.Errorf("%s: Verify = %v, want errors.Is %v", c.name, err, c.want)
		}
	}
	// One matching signature among others is enough (rotation on the consumer side).
	mixed := with(HeaderSignature, "v2,abc v1,AAAA "+fresh(now).Get(HeaderSignature))
	if err := Verify(specSecret, mixed, []byte(specBody), 5*time.Minute); err != nil {
		t.Fatalf("a matching signature among others: %v", err)
	}
}

// FuzzSignature checks signing against an independent HMAC computation, that
// Verify accepts what was signed and rejects a changed body, and that Verify
// never panics on arbitrary headers and bodies.
func FuzzSignature(f *testing.F) {
	f.Add([]byte("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), "msg_p5jXN8AQM9LWM0D4loKWxJek", []byte(`{"test": 2432232314}`), "1614265330", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	f.Fuzz(func(t *testing.T, key []byte, id string, body []byte, rawTimestamp, rawSignature string) {
		// Arbitrary headers: Verify must not panic, whatever it answers.
		secret := sinkconfig.Secret("whsec_" + base64.StdEncoding.EncodeToString(key))
		h := http.Header{}
		h.Set(HeaderID, id)
		h.Set(HeaderTimestamp, rawTimestamp)
		h.Set(HeaderSignature, rawSignature)
		_ = Verify(secret, h, body, 5*time.Minute)
		_ = Verify(secret, h, body, 0)
		_ = Verify(sinkconfig.Secret(rawSignature), h, body, time.Second)

		if len(key) == 0 || id == "" || strings.TrimSpace(id) != id {
			return // http.Header.Get would not return such an id unchanged
		}
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		sig := string(appendSignatures(nil, [][]byte{key}, id, ts, body))
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(id + "." + ts + "." + string(body)))
		if want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)); sig != want {
			t.Fatalf("signature %q, independent computation %q", sig, want)
		}
		h.Set(HeaderTimestamp, ts)
		h.Set(HeaderSignature, sig)
		if err := Verify(secret, h, body, 5*time.Minute); err != nil {
			t.Fatalf("Verify(signed) = %v", err)
		}
		if err := Verify(secret, h, append(body[:len(body):len(body)], 'x'), 5*time.Minute); !errors.Is(err, ErrBadSignature) {
			t.Fatalf("Verify(changed body) = %v, want ErrBadSignature", err)
		}
	})
}

// BenchmarkEncodeSign measures building one request body and signing it
// with two secrets (rotation), without the network.
func BenchmarkEncodeSign(b *testing.B) {
	payload := []byte(`{"order_id":"8c1f0e6a","customer":{"id":42,"name":"Ada Lovelace","email":"ada@example.com"},` +
		`"lines":[{"sku":"A-1","qty":2,"price":"12.50"},{"sku":"B-7","qty":1,"price":"99.00"}],"total":"124.00","currency":"EUR"}`)
	for _, c := range []struct {
		name        string
		format      Format
		contentType string
	}{{"envelope-json", FormatEnvelope, sinks.ContentTypeJSON}, {"envelope-binary", FormatEnvelope, "application/x-protobuf"}, {"raw", FormatRaw, sinks.ContentTypeJSON}} {
		b.Run(c.name, func(b *testing.B) {
			s, err := New("bench", Config{URL: "http://127.0.0.1:1/", Format: c.format, Secret: newSecret(b), Secrets: []sinkconfig.Secret{newSecret(b)}}, quiet)
			if err != nil {
				b.Fatal(err)
			}
			e := sinktest.Event("d", "order-42", payload)
			e.ContentType = c.contentType
			e.Headers = map[string]string{"x-tenant": "acme"}
			ts := strconv.FormatInt(time.Now().Unix(), 10)
			var sig []byte
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				body, _, err := s.body(&e)
				if err != nil {
					b.Fatal(err)
				}
				sig = appendSignatures(sig[:0], s.keys, e.ID, ts, body)
			}
		})
	}
}
