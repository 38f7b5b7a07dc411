module flightcache.dev/e2e/helpers/probe

go 1.24.0
