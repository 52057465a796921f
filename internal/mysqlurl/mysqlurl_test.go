package mysqlurl

import (
	"strings"
	"testing"
	"time"
)

func TestConfig(t *testing.T) {
	cfg, err := Config("mysql://app:p%40ss%3Aw%2Fd@db.example:3307/shop?tls=skip-verify&time_zone=%27%2B00%3A00%27")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "app" || cfg.Passwd != "p@ss:w/d" || cfg.Addr != "db.example:3307" || cfg.Net != "tcp" || cfg.DBName != "shop" {
		t.Errorf("got user %q password %q addr %q net %q database %q", cfg.User, cfg.Passwd, cfg.Addr, cfg.Net, cfg.DBName)
	}
	if !cfg.ParseTime || cfg.Loc != time.UTC || cfg.TLSConfig != "skip-verify" || cfg.Params["time_zone"] != "'+00:00'" {
		t.Errorf("got parseTime %v loc %v tls %q params %v", cfg.ParseTime, cfg.Loc, cfg.TLSConfig, cfg.Params)
	}
	cfg, err = Config("mysql://root@127.0.0.1/test?parseTime=false")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "127.0.0.1:3306" || cfg.ParseTime || cfg.Passwd != "" {
		t.Errorf("defaults: addr %q parseTime %v password %q", cfg.Addr, cfg.ParseTime, cfg.Passwd)
	}
}

func TestConfigErrorsHideThePassword(t *testing.T) {
	for _, raw := range []string{
		"mysql://app:Secret-Pw@db:3306/shop?parseTime=maybe",
		"mysql://app:Secret-Pw@/shop",
		"mysql://app:Secret-Pw@db:3306/a/b",
		"mysql://app:Secret-Pw@db:xx/shop",
		"postgres://app:Secret-Pw@db/shop",
	} {
		_, err := Config(raw)
		if err == nil {
			t.Errorf("%s: accepted", strings.Replace(raw, "Secret-Pw", "***", 1))
			continue
		}
		if strings.Contains(err.Error(), "Secret-Pw") {
			t.Errorf("the error prints the password: %v", err)
		}
	}
	if !Is("MySQL://x@y/z") || Is("postgres://x@y/z") || Is("host=x") {
		t.Error("Is: wrong scheme detection")
	}
}
