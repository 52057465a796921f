package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cookieName is the session cookie.
const cookieName = "herald_console"

// session is a signed-in browser. Its id is the cookie's value: random,
// never the token.
type session struct {
	id      string
	csrf    string
	expires time.Time
}

// sessions are kept in memory: a restart signs everyone out, which for an
// operator's console is a fair price for holding no secret on disk.
type sessions struct {
	mu   sync.Mutex
	max  int
	ttl  time.Duration
	byID map[string]*session
}

func newSessions(max int, ttl time.Duration) *sessions {
	return &sessions{max: max, ttl: ttl, byID: map[string]*session{}}
}

// open starts a session, ending expired ones and, past the bound, the one
// that expires first.
func (s *sessions) open() *session {
	now := time.Now()
	ses := &session{id: randomToken(), csrf: randomToken(), expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, old := range s.byID {
		if now.After(old.expires) {
			delete(s.byID, id)
		}
	}
	for len(s.byID) >= s.max {
		var first *session
		for _, old := range s.byID {
			if first == nil || old.expires.Before(first.expires) {
				first = old
			}
		}
		delete(s.byID, first.id)
	}
	s.byID[ses.id] = ses
	return ses
}

// get returns the live session with the given id, or nil.
func (s *sessions) get(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	ses := s.byID[id]
	if ses == nil {
		return nil
	}
	if time.Now().After(ses.expires) {
		delete(s.byID, id)
		return nil
	}
	return ses
}

func (s *sessions) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, id)
}

// randomToken returns 256 random bits, URL-safe.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it crashes the program instead)
	return base64.RawURLEncoding.EncodeToString(b)
}

type sessionKey struct{}

// sessionOf returns the request's session, set by signedIn or changing.
func sessionOf(r *http.Request) *session {
	s, _ := r.Context().Value(sessionKey{}).(*session)
	return s
}

func withSession(r *http.Request, s *session) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), sessionKey{}, s))
}

// current returns the session the request's cookie names, if live.
func (c *Console) current(r *http.Request) *session {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	return c.sessions.get(ck.Value)
}

// setCookie hands the browser its session.
func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, s *session) {
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: s.id, Path: Prefix,
		Expires: s.expires, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
}

// signedIn serves a page to a session. Without one: with a token, the
// browser is sent to the login form; without a token, a session is opened
// (it carries the CSRF token of the page's forms).
func (c *Console) signedIn(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := c.current(r)
		if s == nil {
			if c.cfg.Token != "" {
				http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			s = c.sessions.open()
			c.setCookie(w, r, s)
		}
		h(w, withSession(r, s))
	})
}

// changing guards a request that changes state: a POST of a live session
// whose form carries that session's CSRF token. Anything else is 403.
func (c *Console) changing(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		s := c.current(r)
		got := r.PostFormValue("csrf")
		if s == nil || got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) != 1 {
			c.log.WarnContext(r.Context(), "console: request refused: no session or a wrong CSRF token", "path", r.URL.Path, "remote", r.RemoteAddr)
			c.render(w, r, http.StatusForbidden, "error", "Forbidden",
				"This form is no longer valid (its session ended, or it was not sent from this console). Reload the page and try again.")
			return
		}
		h(w, withSession(r, s))
	})
}

// operating refuses replay and purge in read-only mode.
func (c *Console) operating(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.ReadOnly {
			c.fail(w, r, http.StatusForbidden, "", errors.New("this console is read-only (admin.console_read_only): replay and purge are turned off"))
			return
		}
		h(w, r)
	}
}

// maxForm bounds a form body: a page of selected ids and the filters.
const maxForm = 1 << 20

// loginData is the login form's.
type loginData struct {
	Next  string
	Error string
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Token == "" || c.current(r) != nil {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	c.render(w, r, http.StatusOK, "login", "Sign in", loginData{Next: safeNext(r.URL.Query().Get("next"))})
}

// login checks the token (in constant time) and opens a session, unless
// the client failed too many sign-ins lately (loginLimiter). The form
// carries no CSRF token, as there is no session yet: the admin server
// refuses a POST from another origin, and a forged login would only sign
// the victim in with the token the forger already knows.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	next := safeNext(r.PostFormValue("next"))
	if c.cfg.Token == "" {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	client := clientOf(r)
	if wait := c.logins.wait(client); wait > 0 {
		secs := int(math.Ceil(wait.Seconds()))
		c.log.WarnContext(r.Context(), "console: sign-in refused: too many failures", "remote", r.RemoteAddr, "retry_after_s", secs)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		c.render(w, r, http.StatusTooManyRequests, "login", "Sign in", loginData{Next: next,
			Error: fmt.Sprintf("Too many failed sign-ins from your address: try again in %d s.", secs)})
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.PostFormValue("token")), []byte(c.cfg.Token.Reveal())) != 1 {
		c.logins.failed(client)
		c.log.WarnContext(r.Context(), "console: sign-in refused: wrong token", "remote", r.RemoteAddr)
		c.render(w, r, http.StatusUnauthorized, "login", "Sign in", loginData{Next: next, Error: "That is not the admin token."})
		return
	}
	c.logins.succeeded(client)
	s := c.sessions.open()
	c.setCookie(w, r, s)
	c.log.InfoContext(r.Context(), "console: signed in", "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	c.sessions.end(sessionOf(r).id)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// safeNext keeps a redirect target within the console: a path under
// Prefix, never another host.
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || next == "" || u.Scheme != "" || u.Host != "" || u.Opaque != "" ||
		!strings.HasPrefix(path.Clean(u.Path)+"/", Prefix) || strings.Contains(u.Path, "..") {
		return Prefix
	}
	return u.RequestURI()
}
