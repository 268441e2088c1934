// HTTP to the vaecast API, with its optional key.
//
// A server started with --api-key answers 401 to /v1 without it. The page then asks
// for the key once, keeps it in localStorage, and sends it as "Authorization: Bearer"
// with fetch(); EventSource, <video src> and download links cannot send a header, so
// the key also goes into the cookie vaecast_api_key, SameSite=Strict: the browser
// attaches it only to requests this site's own pages start (the server's docstring,
// vaecast/server/security.py, says why that is safe).

const KEY_STORAGE = "vaecast_api_key";
const KEY_COOKIE = "vaecast_api_key";
let apiKey = localStorage.getItem(KEY_STORAGE);
let keyAsked = null; // the one pending question, shared by every request that got 401
let promptForKey = () => Promise.reject(new Error("no way to ask for an API key"));

// How to ask the user: reason => Promise of the key typed in (the page's form).
export function useKeyPrompt(prompt) {
  promptForKey = prompt;
}

// Rewrites the cookie from the kept key: it may have gone with the browser session.
export function restoreApiKey() {
  if (apiKey) keepApiKey(apiKey);
}

function keepApiKey(key) {
  apiKey = key;
  localStorage.setItem(KEY_STORAGE, key);
  document.cookie = `${KEY_COOKIE}=${encodeURIComponent(key)}; SameSite=Strict; Path=/`;
}

// fetch() with the key; on 401 asks the user for it and tries again.
export async function apiFetch(url, options = {}) {
  for (;;) {
    const sent = apiKey;
    const headers = new Headers(options.headers);
    if (sent) headers.set("Authorization", `Bearer ${sent}`);
    const response = await fetch(url, { ...options, headers });
    if (response.status !== 401) return response;
    await response.body?.cancel();
    // A key typed in while this request was on its way: try that one first.
    if (apiKey === sent) {
      await askForKey(sent ? "That key was not accepted." : "This server needs an API key.");
    }
  }
}

function askForKey(reason) {
  keyAsked ??= promptForKey(reason).then((key) => {
    keyAsked = null;
    keepApiKey(key);
  });
  return keyAsked;
}

export async function fetchJson(url, options) {
  const response = await apiFetch(url, options);
  if (!response.ok) throw new Error(await errorMessage(response));
  return response.json();
}

export const getJson = (url) => fetchJson(url);

// The server's {"error": {"type", "message"}}, or the HTTP status when there is none.
export async function errorMessage(response) {
  try {
    return (await response.json()).error.message;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}
