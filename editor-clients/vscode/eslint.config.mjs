// ESLint for the extension, its tests and its scripts (`npm run lint`, which
// scripts/test runs). The TypeScript rules use the type checker (projectService reads
// tsconfig.json), so promise mistakes — a floating promise, an async function passed
// where a void callback is expected — are caught, not only syntax. Layout is prettier's
// job (.prettierrc), so no stylistic rules here.
import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
    // Generated or built: src/protocol.ts comes from scripts/gen-protocol.js.
    { ignores: ["out/", "dist/", "node_modules/", "src/protocol.ts"] },
    js.configs.recommended,
    {
        files: ["**/*.ts"],
        extends: [tseslint.configs.recommendedTypeChecked],
        languageOptions: {
            parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
        },
        rules: {
            // `_name` marks a parameter kept for its position (an interface's signature).
            "@typescript-eslint/no-unused-vars": [
                "error",
                { argsIgnorePattern: "^_", varsIgnorePattern: "^_" },
            ],
        },
    },
    {
        // The tests: node:test's `test`/`describe` return promises the runner itself
        // awaits; fakes implement async interfaces without awaiting anything; fixtures
        // and package.json are read as JSON, whose `any` the assertions then check.
        files: ["test/**/*.ts"],
        rules: {
            "@typescript-eslint/no-floating-promises": [
                "error",
                {
                    allowForKnownSafeCalls: [
                        {
                            from: "package",
                            package: "node:test",
                            name: ["test", "describe", "it", "suite"],
                        },
                    ],
                },
            ],
            "@typescript-eslint/require-await": "off",
            "@typescript-eslint/no-unsafe-assignment": "off",
            "@typescript-eslint/no-unsafe-member-access": "off",
            "@typescript-eslint/no-unsafe-argument": "off",
            "@typescript-eslint/no-unsafe-return": "off",
            "@typescript-eslint/no-unsafe-call": "off",
        },
    },
    {
        files: ["**/*.js", "**/*.cjs"],
        languageOptions: {
            sourceType: "commonjs",
            globals: {
                require: "readonly",
                module: "writable",
                exports: "writable",
                __dirname: "readonly",
                process: "readonly",
                console: "readonly",
            },
        },
    },
);
