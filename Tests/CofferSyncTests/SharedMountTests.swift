import CofferTestSupport
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// An accepted share in a real mount, fed by a real server: read by ordinary tools at the link's
/// place, kept current as the owner changes it, and never written from this side (EACCES), so
/// nothing is written locally that the server would refuse.
@Suite(.serialized) struct SharedMountTests {
    func text(_ path: String) -> String? { readFile(path).map { String(decoding: $0, as: UTF8.self) } }

    @Test func anAcceptedShareIsAFolderOfTheMount() throws {
        let tmp = TemporaryDirectory("coffer-share-mount")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        let alice = tmp.sub("alice")
        #expect(coffer(alice, ["init", "alice", "--server", server.url]).status == 0)
        #expect(coffer(alice, ["mkdir", "-p", "projects/site"]).status == 0)
        #expect(coffer(alice, ["write", "projects/site/index.html"], stdin: Array("<h1>hi</h1>".utf8)).status == 0)
        #expect(coffer(alice, ["write", "projects/notes.txt"], stdin: Array("plan\n".utf8)).status == 0)
        let bob = try MountFixture(
            "coffer-share-mount-bob", mount: false, initArguments: ["init", "bob", "--server", server.url],
            mountArguments: ["--sync-interval", "1", "--sync-quiet", "0.3"])
        #expect(coffer(alice, ["share", "add", "projects", "bob"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(bob.dataDir, ["sync"]).status == 0)
        let id = coffer(bob.dataDir, ["share", "pending"]).out.split(separator: "\t").first.map(String.init) ?? ""
        #expect(coffer(bob.dataDir, ["share", "accept", id, "/", "--name", "from-alice"]).status == 0)
        try bob.mount()

        // Ordinary tools read it at the link's place.
        let share = bob.path("from-alice")
        let fm = FileManager.default
        #expect(try fm.contentsOfDirectory(atPath: bob.path("")).sorted() == ["from-alice"])
        #expect(try fm.contentsOfDirectory(atPath: share).sorted() == ["notes.txt", "site"])
        #expect(text(share + "/notes.txt") == "plan\n")
        #expect(text(share + "/site/index.html") == "<h1>hi</h1>")
        let found = run("/usr/bin/find", [share, "-type", "f"]).out.split(separator: "\n").map(String.init).sorted()
        #expect(found == [share + "/notes.txt", share + "/site/index.html"])
        var st = stat()
        #expect(stat(share, &st) == 0 && st.st_mode & S_IFMT == S_IFDIR && st.st_mode & 0o222 == 0)
        #expect(stat(share + "/notes.txt", &st) == 0 && st.st_mode & 0o222 == 0 && st.st_size == 5)

        // Nothing is written into it from this side: EACCES, and nothing changes.
        func fails(_ result: Int32, _ what: String) {
            let e = errno
            #expect(result == -1 && e == EACCES, "\(what): \(result), errno \(e)")
        }
        fails(open(share + "/notes.txt", O_WRONLY), "open for writing")
        fails(open(share + "/notes.txt", O_RDONLY | O_TRUNC), "truncating open")
        fails(open(share + "/new.txt", O_WRONLY | O_CREAT, 0o644), "create")
        fails(mkdir(share + "/dir", 0o755), "mkdir")
        fails(Glibc.rename(share + "/notes.txt", share + "/moved.txt"), "rename inside")
        fails(unlink(share + "/notes.txt"), "unlink")
        fails(chmod(share + "/notes.txt", 0o600), "chmod")
        fails(truncate(share + "/notes.txt", 0), "truncate")
        fails(symlink("x", share + "/link"), "symlink")
        #expect(writeFile(bob.path("mine.txt"), "mine") == 0)
        fails(Glibc.rename(bob.path("mine.txt"), share + "/mine.txt"), "rename into the share")
        #expect(text(share + "/notes.txt") == "plan\n")

        // The owner's changes appear while mounted.
        #expect(coffer(alice, ["write", "projects/todo.txt"], stdin: Array("ship it".utf8)).status == 0)
        #expect(coffer(alice, ["write", "projects/notes.txt"], stdin: Array("plan B\n".utf8)).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(
            eventually(timeout: 15) {
                text(share + "/todo.txt") == "ship it" && text(share + "/notes.txt") == "plan B\n"
            },
            "bob's mount did not follow; log: \(bob.log)")

        // Renaming the link is bob's own change; removing it leaves the share pending again.
        #expect(Glibc.rename(share, bob.path("alice-work")) == 0)
        #expect(text(bob.path("alice-work/todo.txt")) == "ship it")
        #expect(rmdir(bob.path("alice-work")) == 0)
        #expect(try fm.contentsOfDirectory(atPath: bob.path("")).sorted() == ["mine.txt"])
        try bob.unmount()
        #expect(coffer(bob.dataDir, ["share", "pending"]).out.hasPrefix(id + "\t"))
        #expect(coffer(bob.dataDir, ["fsck"]).status == 0)
    }

    /// A write share in a real mount: every tool writes in it as in the account's own tree, the
    /// daemon pushes into the owner's tree, and moves across owners answer EXDEV.
    @Test func aWriteShareIsWrittenByOrdinaryToolsInTheMount() throws {
        let tmp = TemporaryDirectory("coffer-share-mount-write")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        let alice = tmp.sub("alice")
        #expect(coffer(alice, ["init", "alice", "--server", server.url]).status == 0)
        #expect(coffer(alice, ["mkdir", "projects"]).status == 0)
        #expect(coffer(alice, ["write", "projects/notes.txt"], stdin: Array("plan\n".utf8)).status == 0)
        let bob = try MountFixture(
            "coffer-share-mount-write-bob", mount: false, initArguments: ["init", "bob", "--server", server.url],
            mountArguments: ["--sync-interval", "1", "--sync-quiet", "0.3"])
        #expect(coffer(alice, ["share", "add", "projects", "bob", "--write"]).status == 0)
        #expect(coffer(alice, ["sync"]).status == 0)
        #expect(coffer(bob.dataDir, ["sync"]).status == 0)
        let id = coffer(bob.dataDir, ["share", "pending"]).out.split(separator: "\t").first.map(String.init) ?? ""
        #expect(coffer(bob.dataDir, ["share", "accept", id, "/", "--name", "work"]).status == 0)
        try bob.mount()
        let share = bob.path("work")
        var st = stat()
        #expect(stat(share + "/notes.txt", &st) == 0 && st.st_mode & 0o200 != 0)

        // Writes, appends, folders, moves, an editor's save-by-rename, attributes, links.
        #expect(writeFile(share + "/new.txt", "new") == 0)
        let fd = open(share + "/notes.txt", O_WRONLY | O_APPEND)
        #expect(fd >= 0 && write(fd, "more\n", 5) == 5 && close(fd) == 0)
        #expect(mkdir(share + "/dir", 0o755) == 0)
        #expect(Glibc.rename(share + "/new.txt", share + "/dir/new.txt") == 0)
        #expect(writeFile(share + "/.draft.swp", "saved by an editor\n") == 0)
        #expect(Glibc.rename(share + "/.draft.swp", share + "/draft.txt") == 0)
        #expect(chmod(share + "/draft.txt", 0o600) == 0)
        #expect(symlink("draft.txt", share + "/latest") == 0)
        #expect(writeFile(share + "/gone.txt", "x") == 0 && unlink(share + "/gone.txt") == 0)
        // Tools: a copy in with rsync, a git repository made inside.
        let source = tmp.sub("source")
        try FileManager.default.createDirectory(atPath: source + "/sub", withIntermediateDirectories: true)
        #expect(writeFile(source + "/sub/a.txt", "alpha") == 0)
        #expect(run("/usr/bin/rsync", ["-a", source + "/", share + "/copied/"]).status == 0)
        let gitEnv = ["GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t"]
        let git = run("/usr/bin/env", gitEnv + ["git", "-C", share + "/copied", "init", "-q"])
        #expect(git.status == 0, "\(git.err)")
        let add = run("/usr/bin/env", gitEnv + ["git", "-C", share + "/copied", "add", "."])
        let commit = run("/usr/bin/env", gitEnv + ["git", "-C", share + "/copied", "commit", "-qm", "first"])
        #expect(add.status == 0 && commit.status == 0, "\(add.err) \(commit.err)")
        #expect(run("/usr/bin/env", ["git", "-C", share + "/copied", "log", "--oneline"]).out.contains("first"))

        // Across owners: EXDEV, which mv answers by copying.
        #expect(writeFile(bob.path("mine.txt"), "mine") == 0)
        #expect(Glibc.rename(bob.path("mine.txt"), share + "/mine.txt") == -1 && errno == EXDEV)
        #expect(Glibc.rename(share + "/draft.txt", bob.path("draft.txt")) == -1 && errno == EXDEV)
        #expect(run("/bin/mv", [bob.path("mine.txt"), share + "/mine.txt"]).status == 0)

        // The daemon pushes it all into alice's tree.
        #expect(
            eventually(timeout: 20, interval: 0.5) {
                _ = coffer(alice, ["sync"])
                return coffer(alice, ["cat", "projects/copied/sub/a.txt"]).out == "alpha"
                    && coffer(alice, ["cat", "projects/mine.txt"]).out == "mine"
            }, "bob's mount did not push; log: \(bob.log)")
        #expect(coffer(alice, ["cat", "projects/notes.txt"]).out == "plan\nmore\n")
        #expect(coffer(alice, ["cat", "projects/dir/new.txt"]).out == "new")
        #expect(coffer(alice, ["cat", "projects/draft.txt"]).out == "saved by an editor\n")
        #expect(coffer(alice, ["ls", "-l", "projects/draft.txt"]).out.hasPrefix("-rw------- "))
        let listed = coffer(alice, ["ls", "projects"]).out
        #expect(listed == "copied/\ndir/\ndraft.txt\nlatest\nmine.txt\nnotes.txt\n", "\(listed)")
        #expect(coffer(alice, ["fsck"]).status == 0)
        try bob.unmount()
        #expect(coffer(bob.dataDir, ["fsck"]).status == 0)
        #expect(server.audit().status == 0)
    }

    /// Two accounts' mounts on one real server edit one shared folder, each seeing the other's
    /// files; then the owner revokes the other while its mount writes: nothing the grantee's
    /// mount wrote is lost (what the server had taken stays in the owner's tree, the rest is
    /// saved in the grantee's own tree), and the share leaves the grantee's mount.
    @Test func twoAccountsMountsEditOneSharedFolderAndARevocationLosesNothing() throws {
        let tmp = TemporaryDirectory("coffer-share-two-mounts")
        let server = try ServerProcess(dataDirectory: tmp.sub("server"))
        let daemon = ["--sync-interval", "1", "--sync-quiet", "0.3"]
        let alice = try MountFixture(
            "coffer-share-two-alice", mount: false, initArguments: ["init", "alice", "--server", server.url],
            mountArguments: daemon)
        let bob = try MountFixture(
            "coffer-share-two-bob", mount: false, initArguments: ["init", "bob", "--server", server.url],
            mountArguments: daemon)
        #expect(coffer(alice.dataDir, ["mkdir", "team"]).status == 0)
        #expect(coffer(alice.dataDir, ["share", "add", "team", "bob", "--write"]).status == 0)
        #expect(coffer(alice.dataDir, ["sync"]).status == 0)
        #expect(coffer(bob.dataDir, ["sync"]).status == 0)
        let id = coffer(bob.dataDir, ["share", "pending"]).out.split(separator: "\t").first.map(String.init) ?? ""
        #expect(coffer(bob.dataDir, ["share", "accept", id, "/", "--name", "team"]).status == 0)
        try alice.mount()
        try bob.mount()
        defer {
            try? alice.unmount()
            try? bob.unmount()
        }
        // Both write; each mount shows the other's file.
        #expect(writeFile(alice.path("team/from-alice.txt"), "alice\n") == 0)
        #expect(writeFile(bob.path("team/from-bob.txt"), "bob\n") == 0)
        // And a file each whose name and content are markers, for the scan below.
        let (nameMarker, bodyMarker) = ("Qx7sharedNameMarker", "Qx7sharedBodyMarker")
        #expect(mkdir(alice.path("team/\(nameMarker)-dir"), 0o755) == 0)
        #expect(writeFile(alice.path("team/\(nameMarker)-dir/a.txt"), "\(bodyMarker) alice\n") == 0)
        #expect(writeFile(bob.path("team/\(nameMarker)-bob.txt"), "\(bodyMarker) bob\n") == 0)
        #expect(
            eventually(timeout: 20, interval: 0.2) {
                text(alice.path("team/from-bob.txt")) == "bob\n" && text(bob.path("team/from-alice.txt")) == "alice\n"
                    && text(alice.path("team/\(nameMarker)-bob.txt")) == "\(bodyMarker) bob\n"
                    && text(bob.path("team/\(nameMarker)-dir/a.txt")) == "\(bodyMarker) alice\n"
            }, "the mounts did not meet; logs:\n\(alice.log)\n\(bob.log)")
        // The marker scan: nothing of the shared files' names or content on the server, nor in
        // either device's data folder (stores, logs), only behind the mounts.
        for marker in [nameMarker, bodyMarker] {
            for dir in [server.dataDirectory, alice.dataDir, bob.dataDir] {
                let hits = filesContaining(marker, under: dir)
                #expect(hits.isEmpty, "\(marker) found in \(hits)")
            }
        }
        // Bob writes on while alice revokes him.
        var wrote: [Int] = []
        for i in 0..<5 where writeFile(bob.path("team/bob-\(i).txt"), "bob \(i)\n") == 0 { wrote.append(i) }
        #expect(wrote.count == 5)
        #expect(coffer(alice.dataDir, ["share", "remove", "team", "bob"]).status == 0)
        // Refused once the share has left bob's mount (its folder is gone): those were never written.
        for i in 5..<10 where writeFile(bob.path("team/bob-\(i).txt"), "bob \(i)\n") == 0 { wrote.append(i) }
        // Each of bob's files ends in alice's tree or in bob's own "Recovered from team".
        #expect(
            eventually(timeout: 30, interval: 0.5) {
                !FileManager.default.fileExists(atPath: bob.path("team/from-alice.txt"))
            }, "the share did not leave bob's mount; log:\n\(bob.log)")
        #expect(
            eventually(timeout: 10, interval: 0.5) { coffer(bob.dataDir, ["status"]).out.contains("shared:") == false })
        for i in wrote {
            let name = "bob-\(i).txt"
            let kept = eventually(timeout: 10, interval: 0.5) {
                text(alice.path("team/" + name)) == "bob \(i)\n"
                    || text(bob.path("Recovered from team/" + name)) == "bob \(i)\n"
            }
            #expect(kept, "\(name) was lost; logs:\n\(alice.log)\n\(bob.log)")
        }
        #expect(coffer(alice.dataDir, ["fsck"]).status == 0)
        #expect(coffer(bob.dataDir, ["fsck"]).status == 0)
    }
}
