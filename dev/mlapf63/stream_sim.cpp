// dev/mlapf63/stream_sim.cpp - host model of mla_gemm_wgmma.cu's control flow (written by hand from the kernel, not
// compiled from it): the k-step stream across a CTA's tiles, the stage ring (a stage is refilled only after the
// steps that read it are done: at most steps s and s - 1 in flight), the held FP8 chunk's one-step delay, the
// next tile's A rows, and the epilogue's quad transpose, over several shapes and grid sizes.
// Build and run: g++ -O1 -std=c++17 -o /tmp/sim dev/mlapf63/stream_sim.cpp && /tmp/sim   (prints "fails 0").
// Planted faults that fail it: AHEAD 3 with 4 stages; the next rows taken from the current tile; r2 from the
// wrong lane.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cassert>
struct Tile { int m0, n0, h; };
int M, N, K, H, G;
Tile tile_of(int t){ int mt=(M+127)/128, nt=N/128; return {(t%mt)*128, ((t/mt)%nt)*128, t/mt/nt}; }
int fails=0;
#define CHK(c, ...) do{ if(!(c)){ if(fails<10) printf(__VA_ARGS__); fails++; } }while(0)
template<int NST,int AHEAD,bool HOLD> void cta(int bid){
  int tiles=((M+127)/128)*(N/128)*H, ksteps=K/64;
  int total=((tiles-1-bid)/G+1)*ksteps;
  // stage contents: label = tile*1000+ks for B (cp.async, lands at issue for sim), A (held: lands at put)
  std::vector<long> stB(NST,-1), stA(NST,-1);
  struct { int t, ks; int next_m0; int cur_m0; long held=-1; int held_st=-1; bool pend=false; } L;
  L.t=bid; L.ks=0; L.next_m0=tile_of(L.t).m0;
  auto put=[&](){ if(HOLD && L.pend){ stA[L.held_st]=L.held; L.pend=false; } };
  int lpos=0,lst=0;
  std::vector<int> busy(NST,-100); // last compute step that read a stage
  int s_now=-1;
  auto load=[&](int st){
    if(L.ks==0){ L.cur_m0=L.next_m0; CHK(L.cur_m0==tile_of(L.t).m0,"rows of tile %d wrong\n",L.t);
      if(L.t+G<tiles) L.next_m0=tile_of(L.t+G).m0; }
    // stage must not be read by wgmma steps s_now or s_now-1 (may be in flight)
    CHK(busy[st] < s_now-1 || busy[st]==-100, "bid %d: stage %d overwritten at step %d, last read %d\n",bid,st,s_now,busy[st]);
    long lab=(long)L.t*1000+L.ks;
    stB[st]=lab;
    if(HOLD && AHEAD>=2){ L.held=lab; L.held_st=st; L.pend=true; } else stA[st]=lab;
    if(++L.ks==ksteps){L.ks=0; L.t+=G;}
  };
  for(;lpos<AHEAD;lpos++){ put(); if(lpos<total) load(lst); lst=(lst+1)%NST; }
  int cst=0, s=0;
  for(int ct=bid; ct<tiles; ct+=G){
    for(int ks=0;ks<ksteps;ks++,s++){
      s_now=s;
      // top: data for (ct,ks) must be in stage cst (A and B)
      long lab=(long)ct*1000+ks;
      CHK(stB[cst]==lab && stA[cst]==lab,"bid %d step %d: stage %d has B %ld A %ld want %ld\n",bid,s,cst,stB[cst],stA[cst],lab);
      busy[cst]=s;
      put();
      if(lpos<total) load(lst);
      lpos++; lst=(lst+1)%NST; cst=(cst+1)%NST;
    }
  }
  CHK(lpos>=total && !L.pend, "bid %d: leftover\n", bid);
  CHK(s==total, "bid %d: steps %d total %d\n", bid, s, total);
}
void transpose_check(){
  // lane (g,t) v[i] = pair at column 8(4b+i)+2t; after: o[k] should be pair at column 32b+8t+2k
  uint32_t v[32][4], o[32][4];
  for(int l=0;l<32;l++) for(int i=0;i<4;i++){ int t=l&3; v[l][i]=8*i+2*t; } // b=0: column index as value
  auto pick=[&](int l,int idx){ return v[l][idx]; };
  for(int l=0;l<32;l++){ int t=l&3;
    uint32_t r1=pick(l^1,(t^1)^1), r2=pick(l^2,((l^2)&3)^2), r3=pick(l^3,((l^3)&3)^3);
    // shfl_xor(x, m) in lane l returns lane l^m's x; lane l^1 computed pick(v, t'^1) with t'=t^1
    r1=pick(l^1,((l^1)&3)^1);
    uint32_t own=pick(l,t);
    for(int k=0;k<4;k++) o[l][k]=(k==t)?own:(k==(t^1))?r1:(k==(t^2))?r2:r3;
  }
  for(int l=0;l<32;l++){ int t=l&3; for(int k=0;k<4;k++) CHK(o[l][k]==(uint32_t)(8*t+2*k),"transpose lane %d k %d: %u\n",l,k,o[l][k]); }
}
int main(){
  transpose_check();
  int shapes[][4]={{4096,128,512,128},{600,128,512,30},{39,512,128,3},{130,128,512,1},{1,128,64,2},{4096,128,512,16},{1000,256,192,5}};
  int grids[]={132,264,5,3,1,7};
  for(auto &sh: shapes){ M=sh[0];N=sh[1];K=sh[2];H=sh[3];
    int tiles=((M+127)/128)*(N/128)*H;
    for(int g: grids){ G=g<tiles?g:tiles;
      for(int b=0;b<G;b++){ cta<4,2,true>(b); cta<4,2,false>(b); cta<3,1,false>(b); cta<3,1,true>(b); } } }
  printf("fails %d\n",fails); return fails!=0;
}
