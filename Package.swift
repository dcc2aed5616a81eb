// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Coffer",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "coffer", targets: ["coffer"]),
        .executable(name: "coffer-server", targets: ["coffer-server"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.81.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.3.0"),
    ],
    targets: [
        // C shims: one system library each.
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CZstd", pkgConfig: "libzstd", providers: [.apt(["libzstd-dev"])]),
        .systemLibrary(name: "COpenSSL", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CFuse", pkgConfig: "fuse3", providers: [.apt(["libfuse3-dev"])]),
        // One reader of /dev/fuse at a time, spinning before it sleeps. C, because it runs inside
        // libfuse's I/O callbacks.
        .target(name: "CFuseReader", dependencies: ["CFuse"], linkerSettings: [.linkedLibrary("fuse3")]),

        // Cryptography over libsodium (keys, AEAD, wrapping, names, signatures, recovery phrase),
        // with libcrypto for the bulk: large AEAD inputs and HMAC-SHA-256 (`Bulk`).
        .target(name: "CofferCrypto", dependencies: ["CSodium", "COpenSSL"]),
        // The pure core: metadata, encoding, clocks, invariants. No I/O, no clock, no globals.
        .target(name: "CofferModel"),
        // Chunked document content: compression, sealing, manifests.
        .target(name: "CofferContent", dependencies: ["CofferCrypto", "CofferModel", "CZstd"]),
        // The device's SQLite store (GRDB): base and local trees, chunks, inodes.
        .target(
            name: "CofferStore",
            dependencies: [
                "CofferModel", .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ]),
        // The decrypted file tree a user works with: paths, operations, content I/O.
        .target(name: "CofferVault", dependencies: ["CofferCrypto", "CofferModel", "CofferContent", "CofferStore"]),
        // The libfuse3 low-level bridge: operations table, session, conversions, signals. Knows
        // nothing of Coffer.
        .target(name: "CofferFuse", dependencies: ["CFuse", "CFuseReader"]),
        // The FUSE daemon's filesystem: low-level operations over a vault.
        .target(name: "CofferFS", dependencies: ["CofferFuse", "CFuse", "CofferVault", "CofferModel"]),
        // The client–server wire format and request signing, shared by both sides.
        .target(name: "CofferProtocol", dependencies: ["CofferCrypto", "CofferModel"]),
        // The client side of sync: signed calls to the server, the sync routine, the scheduler.
        .target(
            name: "CofferSync",
            dependencies: [
                "CofferVault", "CofferProtocol", "CofferModel", "CofferStore", "CofferContent",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ]),
        // The server's logic and its two storage interfaces (SQLite metadata, directory content).
        .target(
            name: "CofferServerCore",
            dependencies: [
                "CofferProtocol", "CofferModel", "CofferCrypto",
                .product(name: "GRDB", package: "GRDB.swift"),
            ]),
        // The server's HTTP layer (Hummingbird): routes, request authentication, limits, logs.
        .target(
            name: "CofferServerHTTP",
            dependencies: [
                "CofferServerCore", "CofferProtocol", "CofferModel", "CofferCrypto",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HummingbirdTLS", package: "hummingbird"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]),
        .executableTarget(
            name: "coffer-server",
            dependencies: [
                "CofferServerHTTP", "CofferServerCore", "CofferProtocol",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]),
        // The command-line client.
        .executableTarget(
            name: "coffer",
            dependencies: [
                "CofferVault", "CofferFS", "CofferModel", "CofferCrypto", "CofferSync",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]),

        // Shared helpers for tests.
        .target(
            name: "CofferTestSupport", dependencies: ["CofferVault", "CofferCrypto"], path: "Tests/CofferTestSupport"),
        .testTarget(name: "CofferCryptoTests", dependencies: ["CofferCrypto", "CSodium"]),
        .testTarget(name: "CofferModelTests", dependencies: ["CofferModel"]),
        .testTarget(name: "CofferContentTests", dependencies: ["CofferContent", "CofferTestSupport"]),
        .testTarget(name: "CofferStoreTests", dependencies: ["CofferStore", "CofferTestSupport"]),
        .testTarget(name: "CofferVaultTests", dependencies: ["CofferVault", "CofferTestSupport"]),
        .testTarget(name: "CofferCLITests", dependencies: ["CofferTestSupport"]),
        .testTarget(name: "CofferFSTests", dependencies: ["CofferTestSupport"]),
        .testTarget(
            name: "CofferServerTests",
            dependencies: [
                "CofferServerHTTP", "CofferServerCore", "CofferProtocol", "CofferModel", "CofferCrypto",
                "CofferTestSupport",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ]),
        .testTarget(
            name: "CofferSyncTests",
            dependencies: [
                "CofferSync", "CofferVault", "CofferModel", "CofferCrypto", "CofferServerCore", "CofferStore",
                "CofferTestSupport",
            ]),
        .testTarget(
            name: "CofferFSBridgeTests",
            dependencies: ["CofferFuse", "CFuseReader", "CofferFS", "CofferVault", "CofferTestSupport"]),

        // Fuzzing (docs/ARCHITECTURE.md, "Fuzzing"): every decoder of bytes from the network or the
        // disk. `scripts/fuzz` builds it with libFuzzer (`-sanitize=fuzzer -DCOFFER_FUZZING`, scratch
        // path .build-fuzz); the normal build makes it a replayer of the corpus in Fuzz/corpus.
        .executableTarget(
            name: "CofferFuzz",
            dependencies: [
                "CofferModel", "CofferProtocol", "CofferContent", "CofferCrypto", "CofferStore",
            ]),
    ]
)
