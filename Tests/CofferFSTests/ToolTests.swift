import CofferTestSupport
import Foundation
import Testing

/// Real tools living in the mount.
@Suite struct ToolTests {
    let gitEnv = [
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "Tester", "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "Tester", "GIT_COMMITTER_EMAIL": "t@example.org",
    ]

    func git(_ args: [String], in dir: String, home: String) -> ProcessResult {
        var env = gitEnv
        env["HOME"] = home
        return run("/usr/bin/git", ["-C", dir] + args, environment: env)
    }

    @Test func gitWorksInTheMount() throws {
        let m = try MountFixture("coffer-fs-git")
        let home = m.tmp.sub("home")
        let repo = m.path("repo")
        #expect(mkdir(repo, 0o755) == 0)
        #expect(git(["init", "-q", "-b", "main"], in: repo, home: home).status == 0)
        try makeSourceTree(repo + "/src", files: 30)
        for i in 0..<3 {
            #expect(writeFile(repo + "/notes.txt", String(repeating: "revision \(i)\n", count: 100 + i)) == 0)
            let add = git(["add", "-A"], in: repo, home: home)
            #expect(add.status == 0, "\(add.err)")
            let commit = git(["commit", "-q", "-m", "commit \(i)"], in: repo, home: home)
            #expect(commit.status == 0, "\(commit.err)")
        }
        let status = git(["status", "--porcelain"], in: repo, home: home)
        #expect(status.status == 0 && status.out == "", "\(status.out)\(status.err)")
        #expect(git(["rev-list", "--count", "HEAD"], in: repo, home: home).out == "3\n")
        let gc = git(["gc", "-q", "--aggressive", "--prune=now"], in: repo, home: home)
        #expect(gc.status == 0, "\(gc.err)")
        let fsck = git(["fsck", "--full", "--strict"], in: repo, home: home)
        #expect(fsck.status == 0, "\(fsck.err)")
        #expect(git(["status", "--porcelain"], in: repo, home: home).out == "")
        #expect(git(["count-objects", "-v"], in: repo, home: home).out.contains("packs: 1"))
        // A change is seen, and a checkout restores it.
        #expect(writeFile(repo + "/notes.txt", "changed\n") == 0)
        #expect(git(["status", "--porcelain"], in: repo, home: home).out == " M notes.txt\n")
        #expect(git(["checkout", "--", "notes.txt"], in: repo, home: home).status == 0)
        #expect(git(["status", "--porcelain"], in: repo, home: home).out == "")
    }

    @Test func gitCloneIntoTheMount() throws {
        let m = try MountFixture("coffer-fs-clone")
        let home = m.tmp.sub("home")
        let origin = m.tmp.sub("origin")
        #expect(git(["init", "-q", "-b", "main"], in: origin, home: home).status == 0)
        try makeSourceTree(origin + "/tree", files: 40, seed: 5)
        for i in 0..<5 {
            #expect(
                writeFile(origin + "/log-\(i % 2).txt", String(repeating: "entry \(i)\n", count: 50 * (i + 1))) == 0)
            #expect(git(["add", "-A"], in: origin, home: home).status == 0)
            #expect(git(["commit", "-q", "-m", "c\(i)"], in: origin, home: home).status == 0)
        }
        #expect(git(["tag", "v1"], in: origin, home: home).status == 0)
        var env = gitEnv
        env["HOME"] = home
        let clone = run("/usr/bin/git", ["clone", "-q", origin, m.path("clone")], environment: env)
        #expect(clone.status == 0, "\(clone.err)")
        let fsck = git(["fsck", "--full", "--strict"], in: m.path("clone"), home: home)
        #expect(fsck.status == 0, "\(fsck.err)")
        #expect(
            git(["rev-parse", "HEAD"], in: m.path("clone"), home: home).out
                == git(["rev-parse", "HEAD"], in: origin, home: home).out)
        #expect(git(["status", "--porcelain"], in: m.path("clone"), home: home).out == "")
        #expect(git(["tag"], in: m.path("clone"), home: home).out == "v1\n")
        #expect(checksums(m.path("clone/tree")) == checksums(origin + "/tree"))
        // A clone over the "network" transport too (objects arrive as a pack).
        let clone2 = run("/usr/bin/git", ["clone", "-q", "--no-local", origin, m.path("clone2")], environment: env)
        #expect(clone2.status == 0, "\(clone2.err)")
        #expect(git(["fsck", "--full"], in: m.path("clone2"), home: home).status == 0)
    }

    /// Write a temporary file, fsync, rename over the original, while another process holds
    /// the original open: that process keeps reading the old bytes.
    @Test func editorStyleSaveWhileHeldOpen() throws {
        let m = try MountFixture("coffer-fs-editor")
        let doc = m.path("doc.txt")
        let old = String(repeating: "old line\n", count: 2000)
        #expect(writeFile(doc, old) == 0)
        let marker = m.tmp.path + "/opened"
        let holder = spawn(
            python,
            [
                "-c",
                """
                import os, sys, hashlib
                fd = os.open(sys.argv[1], os.O_RDONLY)
                first = os.pread(fd, 1 << 20, 0)
                open(sys.argv[2], 'w').write('x')
                sys.stdin.read()
                again = os.pread(fd, 1 << 20, 0)
                fresh = open(sys.argv[1], 'rb').read()
                digests = [hashlib.sha256(b).hexdigest() for b in (first, again, fresh)]
                print(*digests, os.fstat(fd).st_nlink)
                """, doc, marker,
            ])
        #expect(eventually(timeout: 10) { FileManager.default.fileExists(atPath: marker) })
        // The editor's save, as vim and most editors do it.
        let new = String(repeating: "new line!\n", count: 1500)
        let tmp = m.path(".doc.txt.swp")
        let fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        #expect(fd >= 0)
        #expect(write(fd, new, new.utf8.count) == new.utf8.count)
        #expect(fsync(fd) == 0)
        #expect(close(fd) == 0)
        #expect(rename(tmp, doc) == 0)
        let dirfd = open(m.mountPoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        #expect(fsync(dirfd) == 0)
        close(dirfd)
        close(holder.stdinFD)
        let out = holder.wait()
        let sums = out.out.split(separator: " ").map { $0.trimmingCharacters(in: .whitespacesAndNewlines) }
        let oldSum = sha256(Array(old.utf8))
        let newSum = sha256(Array(new.utf8))
        #expect(sums == [oldSum, oldSum, newSum, "0"], "\(out.out)\(out.err)")
        #expect(text(readFile(doc)) == new)
        #expect(eventually(timeout: 1.0) { coffer(m.dataDir, ["cat", "/doc.txt"]).out == new })
    }

    @Test func rsyncInAndAgainTransfersNothing() throws {
        let m = try MountFixture("coffer-fs-rsync")
        let src = m.tmp.sub("src")
        try makeSourceTree(src, files: 120, seed: 9)
        let first = run("/usr/bin/rsync", ["-a", "--stats", src + "/", m.path("dst") + "/"])
        #expect(first.status == 0, "\(first.err)")
        #expect(checksums(m.path("dst")) == checksums(src))
        #expect(statListing(m.path("dst")) == statListing(src))
        let second = run("/usr/bin/rsync", ["-a", "--itemize-changes", "--stats", src + "/", m.path("dst") + "/"])
        #expect(second.status == 0, "\(second.err)")
        let itemized = second.out.split(separator: "\n").filter {
            $0.hasPrefix(">") || $0.hasPrefix("c") || $0.hasPrefix(".") || $0.hasPrefix("h") || $0.hasPrefix("*")
        }
        #expect(itemized.isEmpty, "\(itemized)")
        #expect(second.out.contains("Number of regular files transferred: 0"), "\(second.out)")
        // rsync back out is byte-identical too.
        let back = m.tmp.sub("back")
        #expect(run("/usr/bin/rsync", ["-a", m.path("dst") + "/", back + "/"]).status == 0)
        #expect(checksums(back) == checksums(src))
    }

    @Test func tarInAndOutWithIdenticalChecksums() throws {
        let m = try MountFixture("coffer-fs-tar")
        let src = m.tmp.sub("src")
        try makeSourceTree(src, files: 150, seed: 3)
        for i in 0..<200 { writeFile(src + "/a/small-\(i)", "small file \(i)\n") }
        let tarIn = m.tmp.path + "/in.tar"
        let tarOut = m.tmp.path + "/out.tar"
        #expect(run("/bin/tar", ["-C", src, "-cf", tarIn, "."]).status == 0)
        #expect(mkdir(m.path("x"), 0o755) == 0)
        let x = run("/bin/tar", ["-C", m.path("x"), "-xf", tarIn])
        #expect(x.status == 0, "\(x.err)")
        let c = run("/bin/tar", ["-C", m.path("x"), "-cf", tarOut, "."])
        #expect(c.status == 0, "\(c.err)")
        let out = m.tmp.sub("out")
        #expect(run("/bin/tar", ["-C", out, "-xf", tarOut]).status == 0)
        let expected = checksums(src)
        #expect(expected.count == 350)
        #expect(checksums(m.path("x")) == expected)
        #expect(checksums(out) == expected)
        #expect(statListing(out) == statListing(src))
        // The listing of both archives names the same entries with the same sizes.
        let listIn = run("/bin/tar", ["-tvf", tarIn]).out.split(separator: "\n").map {
            $0.split(separator: " ", omittingEmptySubsequences: true).dropFirst(2)
        }.map { $0.joined(separator: " ") }.sorted()
        let listOut = run("/bin/tar", ["-tvf", tarOut]).out.split(separator: "\n").map {
            $0.split(separator: " ", omittingEmptySubsequences: true).dropFirst(2)
        }.map { $0.joined(separator: " ") }.sorted()
        #expect(listIn == listOut)
    }

    @Test func sqliteDatabase() throws {
        let m = try MountFixture("coffer-fs-sqlite")
        for mode in ["delete", "wal"] {
            let db = m.path("test-\(mode).db")
            var script = "PRAGMA journal_mode=\(mode);\nCREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, b BLOB);\n"
            for tx in 0..<100 {
                script += "BEGIN;\n"
                for row in 0..<10 {
                    let n = tx * 10 + row
                    script += "INSERT INTO t(v, b) VALUES('row \(n)', randomblob(\(100 + n % 900)));\n"
                }
                script += "COMMIT;\n"
            }
            let r = run("/usr/bin/sqlite3", [db], stdin: Array(script.utf8))
            #expect(r.status == 0, "\(mode): \(r.err)")
            let q = run("/usr/bin/sqlite3", [db, "SELECT count(*), count(DISTINCT v) FROM t; PRAGMA integrity_check;"])
            #expect(q.out == "1000|1000\nok\n", "\(mode): \(q.out)\(q.err)")
        }
        // Still whole after a remount.
        try m.unmount()
        try m.mount()
        for mode in ["delete", "wal"] {
            let q = run(
                "/usr/bin/sqlite3", [m.path("test-\(mode).db"), "PRAGMA integrity_check; SELECT max(id) FROM t;"])
            #expect(q.out == "ok\n1000\n", "\(mode): \(q.out)\(q.err)")
        }
    }

    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/vi"))) func vimEditsAFile() throws {
        let m = try MountFixture("coffer-fs-vim")
        let f = m.path("notes.txt")
        #expect(writeFile(f, "first\nsecond\n") == 0)
        let home = m.tmp.sub("home")
        let r = run(
            "/usr/bin/vi",
            ["-u", "NONE", "-i", "NONE", "-N", "-es", "-c", "normal Gohello", "-c", "1s/first/FIRST/", "-c", "wq", f],
            environment: ["HOME": home, "TERM": "dumb"])
        #expect(r.status == 0, "\(r.out)\(r.err)")
        #expect(text(readFile(f)) == "FIRST\nsecond\nhello\n")
        // With a backup copy written and renamed, as :set backup does.
        let r2 = run(
            "/usr/bin/vi",
            [
                "-u", "NONE", "-i", "NONE", "-N", "-es", "-c", "set backup writebackup backupcopy=no",
                "-c", "normal ggdd", "-c", "wq", f,
            ], environment: ["HOME": home, "TERM": "dumb"])
        #expect(r2.status == 0, "\(r2.out)\(r2.err)")
        #expect(text(readFile(f)) == "second\nhello\n")
        #expect(eventually(timeout: 1.0) { coffer(m.dataDir, ["cat", "/notes.txt"]).out == "second\nhello\n" })
    }
}

func sha256(_ bytes: [UInt8]) -> String {
    let r = run("/usr/bin/sha256sum", ["-"], stdin: bytes)
    return String(r.out.prefix(64))
}
