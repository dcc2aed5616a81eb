import CofferTestSupport
import Foundation
import Testing

/// Drives the real `coffer` binary the way a new user would.
@Suite struct CLIWorkflowTests {
    @Test func newUserWorkflow() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        #expect(coffer(data, ["init", "alice"]).status == 0)
        #expect(coffer(data, ["whoami"]).out.hasPrefix("alice"))
        #expect(coffer(data, ["mkdir", "-p", "a/b"]).status == 0)
        #expect(coffer(data, ["write", "a/b/n.txt"], stdin: Array("hello, coffer\n".utf8)).status == 0)
        #expect(coffer(data, ["mv", "a/b/n.txt", "a/m.txt"]).status == 0)
        #expect(coffer(data, ["cat", "a/m.txt"]).out == "hello, coffer\n")
        #expect(coffer(data, ["cat", "a/b/n.txt"]).status != 0)
        let ls = coffer(data, ["ls", "a"])
        #expect(ls.out == "b/\nm.txt\n")
        let long = coffer(data, ["ls", "-l", "a"]).out
        #expect(long.contains("-rw-r--r--") && long.contains("m.txt") && long.contains(" 14 "))
        let tree = coffer(data, ["tree"]).out
        #expect(tree.contains("└── a/") && tree.contains("m.txt") && tree.contains("2 folders, 1 files"))
        // Overwrite replaces content.
        #expect(coffer(data, ["write", "a/m.txt"], stdin: Array("second".utf8)).status == 0)
        #expect(coffer(data, ["cat", "a/m.txt"]).out == "second")
        #expect(coffer(data, ["rm", "-r", "a"]).status == 0)
        #expect(coffer(data, ["ls"]).out == "")
        let fsck = coffer(data, ["fsck"])
        #expect(fsck.status == 0, "\(fsck.err)")
        #expect(fsck.out.contains("clean"))
    }

    @Test func importExportRoundTripKeepsBytesModesAndTimes() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        let src = tmp.sub("src")
        // A real tree: nested folders, empty file, binary file over several chunks, odd modes, symlink.
        try FileManager.default.createDirectory(atPath: src + "/docs/deep/er", withIntermediateDirectories: true)
        try Data("notes\n".utf8).write(to: URL(fileURLWithPath: src + "/docs/notes.txt"))
        try Data().write(to: URL(fileURLWithPath: src + "/docs/deep/empty"))
        try Data(pseudoRandomBytes(count: 700_000, seed: 7)).write(
            to: URL(fileURLWithPath: src + "/docs/deep/er/blob.bin"))
        try Data("#!/bin/sh\necho hi\n".utf8).write(to: URL(fileURLWithPath: src + "/run.sh"))
        chmod(src + "/run.sh", 0o750)
        chmod(src + "/docs/notes.txt", 0o600)
        symlink("docs/notes.txt", src + "/link")
        #expect(
            sh(
                "touch -h -d '2001-02-03 04:05:06.123456789' '\(src)/docs/notes.txt' '\(src)/run.sh'"
                    + " '\(src)/docs/deep/er/blob.bin' '\(src)/docs/deep' '\(src)/docs' '\(src)/link'"
            ).status == 0)
        #expect(
            sh("touch -a -d @1000000000.5 '\(src)/run.sh' && touch -h -a -d @1000000001.25 '\(src)/link'").status == 0)

        #expect(coffer(data, ["init", "bob"]).status == 0)
        let imp = coffer(data, ["import", src, "copy"])
        #expect(imp.status == 0, "\(imp.err)")
        let out = tmp.sub("out")
        let exp = coffer(data, ["export", "copy", out])
        #expect(exp.status == 0, "\(exp.err)")
        // atime too, checked before anything below reads the exported files.
        let runAtime = lstatOf(out + "/copy/run.sh")?.st_atim
        let linkAtime = lstatOf(out + "/copy/link")?.st_atim
        #expect(runAtime?.tv_sec == 1_000_000_000 && runAtime?.tv_nsec == 500_000_000)
        #expect(linkAtime?.tv_sec == 1_000_000_001 && linkAtime?.tv_nsec == 250_000_000)
        // Byte-for-byte, and mode, mtime (to the nanosecond) and symlink targets.
        let diff = sh("diff -r --no-dereference '\(src)' '\(out)/copy'")
        #expect(diff.status == 0, "\(diff.out)")
        let statCmd = "cd '%@' && find . -mindepth 1 | sort | xargs stat -c '%n %a %y %s %F'"
        let a = sh(String(format: statCmd, src)).out
        let b = sh(String(format: statCmd, out + "/copy")).out
        #expect(!a.isEmpty)
        #expect(a == b)
        #expect(coffer(data, ["fsck"]).status == 0)
        // Importing onto an existing name is refused.
        #expect(coffer(data, ["import", src + "/run.sh", "copy/run.sh"]).status != 0)
    }

    @Test func refusalsLeaveTheStoreUnchanged() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        #expect(coffer(data, ["init", "carol"]).status == 0)
        #expect(coffer(data, ["mkdir", "-p", "a/b/c"]).status == 0)
        #expect(coffer(data, ["write", "a/x.txt"], stdin: Array("x".utf8)).status == 0)
        #expect(coffer(data, ["write", "a/y.txt"], stdin: Array("y".utf8)).status == 0)
        func snapshot() -> String {
            coffer(data, ["ls", "-l", "a"]).out + coffer(data, ["tree"]).out + coffer(data, ["status"]).out
        }
        let before = snapshot()
        let cases: [([String], String)] = [
            (["mkdir", "a"], "already exists"),
            (["mv", "a/x.txt", "a/y.txt"], "already exists"),
            (["mv", "a", "a/b/c"], "into itself"),
            (["mv", "a/b", "a/b/c/d"], "into itself"),
            (["write", "missing/parent.txt"], "no such file"),
            (["cat", "a/b"], "is a folder"),
            (["rm", "a"], "folder"),
            (["mkdir", "a/bad/name"], "no such file"),
            (["cat", "nope"], "no such file"),
        ]
        for (args, fragment) in cases {
            let r = coffer(data, args, stdin: [])
            #expect(r.status == 1, "\(args) exited \(r.status)")
            let lines = r.err.split(separator: "\n")
            #expect(lines.count == 1, "\(args): \(r.err)")
            #expect(r.err.lowercased().contains(fragment), "\(args): \(r.err)")
            #expect(r.err.hasPrefix("coffer: "), "\(args): \(r.err)")
        }
        #expect(snapshot() == before)
        #expect(coffer(data, ["fsck"]).status == 0)
        // Without an account: a clear message, not a crash.
        let none = coffer(tmp.sub("empty"), ["ls"])
        #expect(none.status == 1 && none.err.contains("no Coffer account"))
        // A second init on the same store is refused.
        #expect(coffer(data, ["init", "again"]).status == 1)
    }

    @Test func accountExportAndImport() throws {
        let tmp = TemporaryDirectory()
        let a = tmp.sub("a")
        let b = tmp.sub("b")
        let c = tmp.sub("c")
        let d = tmp.sub("d")
        #expect(coffer(a, ["init", "dave"]).status == 0)
        let phrase = coffer(a, ["account", "export", "--phrase"]).out
        #expect(phrase.split(separator: " ").count == 24)
        let key = coffer(a, ["account", "export"]).out
        #expect(key.hasPrefix("coffer1:"))
        #expect(coffer(b, ["account", "import"], stdin: Array(phrase.utf8)).status == 0)
        #expect(coffer(c, ["account", "import"], stdin: Array(key.utf8)).status == 0)
        let id = coffer(a, ["whoami"]).out.split(separator: "(").last
        #expect(coffer(b, ["whoami"]).out.split(separator: "(").last == id)
        #expect(coffer(c, ["whoami"]).out.split(separator: "(").last == id)
        // One wrong word: refused with the reason.
        var words = phrase.split(separator: " ").map(String.init)
        words[3] = words[3] == "abandon" ? "ability" : "abandon"
        let bad = coffer(d, ["account", "import"], stdin: Array(words.joined(separator: " ").utf8))
        #expect(bad.status == 1)
        #expect(bad.err.contains("recovery phrase"))
        #expect(!FileManager.default.fileExists(atPath: d + "/account.secret"))
    }

    @Test func completionsForEveryShell() {
        for shell in ["bash", "zsh", "fish"] {
            let r = run(cofferBinary, ["completions", shell])
            #expect(r.status == 0)
            #expect(r.out.contains("coffer") && r.out.contains("mkdir"))
        }
        #expect(run(cofferBinary, ["completions", "tcsh"]).status == 1)
    }

    @Test func editRunsTheEditorOnAPrivateCopy() throws {
        let tmp = TemporaryDirectory()
        let data = tmp.sub("data")
        #expect(coffer(data, ["init", "erin"]).status == 0)
        #expect(coffer(data, ["write", "e.txt"], stdin: Array("one\n".utf8)).status == 0)
        // The "editor" appends a line and records where the copy lived.
        let log = tmp.path + "/where"
        let editor = "sh -c 'echo two >> \"$1\"; echo \"$1\" > \(log)' sh"
        let r = coffer(data, ["edit", "e.txt"], environment: ["COFFER_EDITOR": editor])
        #expect(r.status == 0, "\(r.err)")
        #expect(coffer(data, ["cat", "e.txt"]).out == "one\ntwo\n")
        let copy =
            (try? String(contentsOfFile: log, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
        #expect(!copy.isEmpty && !FileManager.default.fileExists(atPath: copy), "temporary copy left behind: \(copy)")
        // A failing editor changes nothing.
        #expect(coffer(data, ["edit", "e.txt"], environment: ["COFFER_EDITOR": "false"]).status == 1)
        #expect(coffer(data, ["cat", "e.txt"]).out == "one\ntwo\n")
    }
}
